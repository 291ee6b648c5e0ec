"""torch.distributed.pipelining in a Kineto trace: its actions, their stages and the schedule they make."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.pipelining.actions import Action as Action
    from ppscope.formats.pipelining.actions import name_schedule as name_schedule
    from ppscope.formats.pipelining.actions import placement_name as placement_name
    from ppscope.formats.pipelining.job import PipelineRank as PipelineRank
    from ppscope.formats.pipelining.job import cpu_compute as cpu_compute
    from ppscope.formats.pipelining.job import read_pipeline as read_pipeline
    from ppscope.formats.pipelining.rank import RankEvents as RankEvents
    from ppscope.formats.pipelining.rank import top_level as top_level

_WHERE = {
    "Action": "actions",
    "PipelineRank": "job",
    "RankEvents": "rank",
    "cpu_compute": "job",
    "name_schedule": "actions",
    "placement_name": "actions",
    "read_pipeline": "job",
    "top_level": "rank",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

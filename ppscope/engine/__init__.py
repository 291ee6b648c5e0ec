"""The pipeline-parallel inference engine that ppscope profiles: a Llama-style decoder split over ranks
that form a ring, with gpipe / interleaved / serve schedules, every step recorded as a span.

Entry point: `ppscope.engine.launch.run(EngineConfig(...)) -> run directory` (what `ppscope run` calls).
"""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.engine.config import EngineConfig as EngineConfig
    from ppscope.engine.config import config_fields as config_fields
    from ppscope.engine.launch import run as run
    from ppscope.engine.launch import under_torchrun as under_torchrun
    from ppscope.engine.profiler import profile_layers as profile_layers
    from ppscope.engine.profiler import write_profile as write_profile
    from ppscope.engine.tuning import RunSummary as RunSummary
    from ppscope.engine.tuning import TuneResult as TuneResult
    from ppscope.engine.tuning import tune as tune
    from ppscope.engine.worker import default_run_dir as default_run_dir

_WHERE = {
    "EngineConfig": "config",
    "RunSummary": "tuning",
    "TuneResult": "tuning",
    "config_fields": "config",
    "default_run_dir": "worker",
    "profile_layers": "profiler",
    "run": "launch",
    "tune": "tuning",
    "under_torchrun": "launch",
    "write_profile": "profiler",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

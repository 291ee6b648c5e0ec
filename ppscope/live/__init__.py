"""Live metrics: a run followed while it is written, its last seconds analysed again and again.

`metrics.py` turns an analysis of a sliding window into metric values (pure: no clock, no files, no server);
`follow.py` polls a run directory (`RunTail`), keeps only what the window needs and re-analyses it. Neither
knows Prometheus: `ppscope watch` and `ppscope run --prometheus-port` (in `ppscope/cli/exporter.py`) serve
the values in its text format.
"""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.live.follow import RunFollower as RunFollower
    from ppscope.live.metrics import SPECS as SPECS
    from ppscope.live.metrics import Snapshot as Snapshot

_WHERE = {
    "RunFollower": "follow",
    "SPECS": "metrics",
    "Snapshot": "metrics",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

"""ppscope: bubbles, bottleneck stage and the best layer split for pipeline-parallel LLM inference.

The package imports neither torch nor streamlit; the names below load their modules on first use so that
`ppscope --help` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppscope.exports import public_names

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ppscope.trace.model import RunMeta as RunMeta
    from ppscope.trace.model import SpanKind as SpanKind
    from ppscope.trace.model import Trace as Trace
    from ppscope.trace.recorder import Recorder as Recorder
    from ppscope.trace.store import RunTail as RunTail
    from ppscope.trace.store import load_run as load_run
    from ppscope.trace.store import read_since as read_since

_WHERE = {
    "Recorder": "trace.recorder",
    "RunMeta": "trace.model",
    "SpanKind": "trace.model",
    "Trace": "trace.model",
    "RunTail": "trace.store",
    "load_run": "trace.store",
    "read_since": "trace.store",
}
__all__ = ["__version__", *sorted(_WHERE)]
__getattr__, __dir__ = public_names(__name__, _WHERE)

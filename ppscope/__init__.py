"""ppscope: bubbles, bottleneck stage and the best layer split for pipeline-parallel LLM inference.

The package imports neither torch nor streamlit; the names below load their modules on first use so that
`ppscope --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Recorder",
    "RunMeta",
    "RunTail",
    "SpanKind",
    "Trace",
    "__version__",
    "load_run",
    "read_since",
]

_LAZY = {
    "Recorder": "ppscope.recorder",
    "RunMeta": "ppscope.trace",
    "SpanKind": "ppscope.trace",
    "Trace": "ppscope.trace",
    "RunTail": "ppscope.store",
    "load_run": "ppscope.store",
    "read_since": "ppscope.store",
}

if TYPE_CHECKING:
    from ppscope.recorder import Recorder
    from ppscope.store import RunTail, load_run, read_since
    from ppscope.trace import RunMeta, SpanKind, Trace


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ppscope' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

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
    "Recorder": "ppscope.trace.recorder",
    "RunMeta": "ppscope.trace.model",
    "SpanKind": "ppscope.trace.model",
    "Trace": "ppscope.trace.model",
    "RunTail": "ppscope.trace.store",
    "load_run": "ppscope.trace.store",
    "read_since": "ppscope.trace.store",
}

if TYPE_CHECKING:
    from ppscope.trace.model import RunMeta, SpanKind, Trace
    from ppscope.trace.recorder import Recorder
    from ppscope.trace.store import RunTail, load_run, read_since


def __dir__() -> list[str]:
    """The lazy names too (PEP 562), so `dir(ppscope)` and completion show what `ppscope` hands out."""
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ppscope' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

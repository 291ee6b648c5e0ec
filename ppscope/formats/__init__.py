"""Interop: importers (nsys SQLite, Kineto JSON) and exporters (nsys SQLite, Chrome/Perfetto, NVTXT).

Importers turn third-party traces into a `Trace`; exporters write a `Trace` for the tools people already
use. Detection by content lives in `detect`; `ppscope.formats.sources.open_trace` is the one entry point commands
use to read, `export_trace` the one they use to write. Submodules load pandas lazily through it.
"""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.detect import InputKind as InputKind
    from ppscope.formats.export import EXPORT_FORMATS as EXPORT_FORMATS
    from ppscope.formats.export import export_run as export_run
    from ppscope.formats.export import export_trace as export_trace
    from ppscope.formats.nvtxt import NVTXT_FILES as NVTXT_FILES
    from ppscope.formats.sources import open_trace as open_trace

_WHERE = {
    "EXPORT_FORMATS": "export",
    "InputKind": "detect",
    "NVTXT_FILES": "nvtxt",
    "export_run": "export",
    "export_trace": "export",
    "open_trace": "sources",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

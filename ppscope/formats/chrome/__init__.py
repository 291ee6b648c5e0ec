"""Chrome trace-event JSON, for Perfetto and chrome://tracing: a Trace or a run written a rank at a time."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.chrome.writer import export_chrome as export_chrome
    from ppscope.formats.chrome.writer import export_chrome_run as export_chrome_run

_WHERE = {
    "export_chrome": "writer",
    "export_chrome_run": "writer",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

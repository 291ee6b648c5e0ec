"""Nsight Systems: read an `nsys export --type sqlite` file as a Trace, and write a Trace as one."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.nsys.reader import load_nsys as load_nsys
    from ppscope.formats.nsys.writer import export_nsys as export_nsys
    from ppscope.formats.nsys.writer import export_nsys_run as export_nsys_run
    from ppscope.formats.nsys.writer import ppscope_message as ppscope_message

_WHERE = {
    "export_nsys": "writer",
    "export_nsys_run": "writer",
    "load_nsys": "reader",
    "ppscope_message": "writer",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

"""PyTorch profiler (Kineto) JSON: one file per rank, read fast as columns and joined into one Trace."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.kineto.reader import load_kineto as load_kineto

_WHERE = {
    "load_kineto": "reader",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

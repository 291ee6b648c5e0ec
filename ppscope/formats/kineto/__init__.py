"""PyTorch profiler (Kineto) JSON: one file per rank, read fast as columns and joined into one Trace."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.kineto.decode import group_key as group_key
    from ppscope.formats.kineto.decode import iter_chrome_batches as iter_chrome_batches
    from ppscope.formats.kineto.reader import load_kineto as load_kineto
    from ppscope.formats.kineto.times import NS_LIMIT as NS_LIMIT

_WHERE = {
    "NS_LIMIT": "times",
    "group_key": "decode",
    "iter_chrome_batches": "decode",
    "load_kineto": "reader",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

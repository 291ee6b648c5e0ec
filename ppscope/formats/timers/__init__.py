"""Chrome traces of pipeline operations timed by the training job (Megatron-style timers), read as a Trace."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.timers.reader import load_timers as load_timers

_WHERE = {
    "load_timers": "reader",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

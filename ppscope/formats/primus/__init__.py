"""AMD Primus' pipeline dumps (`--dump_pp_data`: one `pp_rank_N.json` per stage), read as a Trace."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.formats.primus.reader import load_primus as load_primus

_WHERE = {
    "load_primus": "reader",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

"""One module per `ppscope` subcommand; each exposes `register(subparsers)`."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.cli.commands.dashboard import is_loopback as is_loopback

_WHERE = {
    "is_loopback": "dashboard",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

"""The argparse types the commands are built with, named once: argparse keeps its subcommands' and groups'
classes private, and a command's `register` takes the one and fills the other."""

from __future__ import annotations

import argparse
from typing import TypeAlias

__all__ = ["Options", "Subcommands"]

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What `register(sub)` adds its command's parser to."""
Options: TypeAlias = "argparse.ArgumentParser | argparse._ArgumentGroup"
"""A parser or a group of its options: where `add_argument` puts an option."""

"""A package's public names, each loaded from its module on first use (PEP 562).

Every package's `__init__` lists the names the other parts of ppscope import from its modules (and any it
hands to users), with the module each lives in; importing one module of a package then loads no other, and
`ppscope --help` stays fast. `tests/test_project_package.py` checks that the lists cover what the parts import.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["public_names"]


def public_names(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public name N lives in `package.where[N]`."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # later lookups find it without this function
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return getattr_, dir_

"""`raises_code`: a test of a ppscope error by its type and its code, never by its message's words."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ppscope.errors import ErrorCode, PPScopeError


@contextmanager
def raises_code(error: type[PPScopeError], code: ErrorCode) -> Iterator[pytest.ExceptionInfo[PPScopeError]]:
    """`pytest.raises(error)` that also checks the error's code: a message can be reworded freely."""
    with pytest.raises(error) as info:
        yield info
    assert info.value.code == code, f"{info.value.code} ({info.value}), expected {code}"

"""What a benchmark returns: one `Figure` per measured figure, and the Markdown table they make.

A figure is a value next to a reference measured in the same run (the machines these run on are shared and
noisy: the ratio is what carries from one run to the next, the absolute values are context). `ratio` is the
value ÷ the reference unless the figure's name says which ratio it is (a measured gain ÷ a predicted gain, the
median of per-round ratios). Each figure keeps the time it was made and the machine's 1-minute load average
then, so that a table of figures measured at different times says so row by row.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

Value = float | int | str | None

COLUMNS = ("figure", "value", "reference", "ratio", "target", "met", "date", "machine load")


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


@dataclass
class Figure:
    """One measured figure: `value` in `unit`, next to `reference_value` (in the same unit) of what
    `reference_name` names, measured in the same run; `ratio` defaults to value ÷ reference (NaN: none to give);
    `target` says what it should be ("<= 1 s"), `met` whether it is (None: no target). A figure without a
    reference (a count, a time that only sets the scene) leaves it out; `value` None: not recorded."""

    name: str
    value: Value
    unit: str = ""
    reference_name: str = ""
    reference_value: Value = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    date: str = field(default_factory=_now)
    load: float | None = field(default_factory=_load)

    def __post_init__(self) -> None:
        if self.ratio is None and _number(self.value) and _number(self.reference_value) and self.reference_value:
            self.ratio = float(self.value) / float(self.reference_value)  # type: ignore[arg-type]

    def cells(self) -> list[str]:
        """The row of the figure in the order of COLUMNS."""
        reference = self.reference_name
        if self.reference_value is not None:
            reference += f": {quantity(self.reference_value, self.unit)}"
        return [
            self.name,
            quantity(self.value, self.unit),
            reference,
            _ratio(self.ratio),
            self.target,
            {None: "", True: "yes", False: "NO"}[self.met],
            self.date,
            "" if self.load is None else f"{self.load:.1f}",
        ]

    def __str__(self) -> str:
        """One line for the console: the figure, its reference and ratio, its target."""
        out = f"{self.name}: {quantity(self.value, self.unit)}"
        if self.reference_name:
            out += f" (reference, {self.reference_name}"
            out += f": {quantity(self.reference_value, self.unit)})" if self.reference_value is not None else ")"
        if self.ratio is not None and not (self.unit == "x" and self.ratio == self.value):
            out += f" = {_ratio(self.ratio)}"
        if self.target:
            out += f"; target {self.target}: {'met' if self.met else 'NOT met'}"
        return out


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _ratio(x: float | None) -> str:
    """ "" where a figure has no reference, "–" where it has one but no ratio (nothing to compare)."""
    if x is None:
        return ""
    return f"{number(x)}x" if math.isfinite(x) else "–"


def number(x: float | int) -> str:
    """A figure as the tables give it: 3 decimals from 0.1 to 10 (speedups and ratios near 1 differ there), 1
    from 10 to 100, none above, thousands separated, 3 significant digits below 0.1; integers as they are."""
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    size = abs(x)
    if size == 0:
        return "0"
    digits = 0 if size >= 100 else 1 if size >= 10 else 3 if size >= 0.1 else 2 - math.floor(math.log10(size))
    return f"{x:,.{digits}f}"


def quantity(value: Value, unit: str) -> str:
    """A value with its unit, as the tables show it ("0.490 s", "1.43x", "yes"); "–" for none."""
    if value is None:
        return "–"
    if isinstance(value, str | bool):
        return str(value)
    text = number(value)
    if not unit:
        return text
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}"


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def table(figures: list[Figure]) -> list[str]:
    """The figures as the lines of one Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_escape(c) for c in f.cells()) + " |" for f in figures]
    return lines

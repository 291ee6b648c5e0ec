"""benchmarks/RESULTS.md: one table per benchmark, built from the figures a benchmark returns; running some
benchmarks replaces only their tables."""

from __future__ import annotations

import math

from benchmarks.__main__ import HEADER, results, section, sections
from benchmarks.record import COLUMNS, Figure, table


def test_a_figure_is_a_row_of_value_reference_ratio_target_date_and_load() -> None:
    fig = Figure("analyze()", 0.5, "s", "sorting the spans", 0.25, target="<= 1 s", met=True, date="D", load=1.25)
    assert fig.ratio == 2.0
    assert fig.cells() == ["analyze()", "0.500 s", "sorting the spans: 0.250 s", "2.000x", "<= 1 s", "yes", "D", "1.2"]
    assert str(fig) == "analyze(): 0.500 s (reference, sorting the spans: 0.250 s) = 2.000x; target <= 1 s: met"
    lines = table([fig, Figure("skipped", "skipped: no Chromium | none", date="D", load=None)])
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |" and len(lines) == 4
    assert lines[3] == "| skipped | skipped: no Chromium \\| none |  |  |  |  | D |  |"


def test_a_ratio_named_by_the_figure_is_kept_and_nan_says_there_is_none() -> None:
    assert Figure("gain", 1.2, "x", "predicted", 1.1, ratio=2.0).ratio == 2.0
    keep = Figure("advice keep", 0.98, "x", "predicted", 1.0, ratio=math.nan)
    assert keep.cells()[3] == "–" and Figure("count", 3).cells()[1:4] == ["3", "", ""]
    assert Figure("none yet", None, "s", "reference", 2.0).cells()[1:4] == ["–", "reference: 2.000 s", ""]


def test_running_some_benchmarks_replaces_only_their_tables() -> None:
    old = "\n".join([*HEADER, "## analysis", "", "kept as it is", "", "## balance", "", "old balance", ""])
    new = results(old, {"balance": section("balance", [Figure("b", 1.0, "ms", date="D", load=0.5)], 2.0)})
    got = sections(new)
    assert list(got) == ["analysis", "balance"]
    assert got["analysis"] == "## analysis\n\nkept as it is\n\n"
    assert "old balance" not in got["balance"] and "| b | 1.000 ms |  |  |  |  | D | 0.5 |" in got["balance"]
    assert new.startswith("\n".join(HEADER)) and results(new, {}) == new

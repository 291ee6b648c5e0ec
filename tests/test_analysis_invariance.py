"""Properties: results do not depend on the order of spans or on a constant shift of the clock."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from ppscope.analysis import AnalysisConfig, analyze
from ppscope.trace.model import RunMeta, Trace, spans_frame

KINDS = ["forward", "recv_wait", "send", "recv", "nccl", "host", "sample"]

span = st.tuples(
    st.integers(0, 3),  # rank
    st.sampled_from(KINDS),
    st.integers(-1, 3),  # mb
    st.integers(0, 10_000),  # start
    st.integers(0, 3_000),  # duration
    st.sampled_from(["", "decode"]),
)


def _frame(rows: list[tuple[int, str, int, int, int, str]], shift: int = 0) -> pd.DataFrame:
    return spans_frame(
        {
            "rank": [r[0] for r in rows],
            "stage": [r[0] for r in rows],
            "lane": ["compute" if r[1] in ("forward", "sample") else "other" for r in rows],
            "kind": [r[1] for r in rows],
            "name": [r[1] for r in rows],
            "mb": [r[2] for r in rows],
            "step": [0] * len(rows),
            "chunk": [0] * len(rows),
            "phase": [r[5] for r in rows],
            "start_ns": [r[3] + shift for r in rows],
            "end_ns": [r[3] + r[4] + shift for r in rows],
            "nbytes": [100] * len(rows),
            "tokens": [1] * len(rows),
            "peer": [(r[0] + 1) % 4 for r in rows],
        }
    )


def _key(trace: Trace, config: AnalysisConfig) -> dict[str, object]:
    out = analyze(trace, config).to_json()
    out.pop("window")
    return out


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(span, min_size=1, max_size=40),
    perm_seed=st.integers(0, 2**32 - 1),
    shift=st.integers(-(10**15), 10**15),
    mode=st.sampled_from(["full", "steady", "active"]),
)
def test_invariant_to_order_and_clock_shift(
    rows: list[tuple[int, str, int, int, int, str]], perm_seed: int, shift: int, mode: str
) -> None:
    meta = RunMeta(pp_size=4, schedule="serve", world_size=4)
    config = AnalysisConfig(steady=mode == "steady", active=mode == "active")
    base = _key(Trace(spans=_frame(rows), meta=meta), config)
    shuffled = _frame(rows, shift).sample(frac=1.0, random_state=perm_seed % 2**32).reset_index(drop=True)
    moved = _key(Trace(spans=shuffled, meta=meta), config)
    assert moved == base
    for s in base["stages"]:  # type: ignore[attr-defined]
        if s["causes"] is None:  # a stage that recorded nothing: its figures are unknown, not zero
            continue
        assert sum(s["causes"].values()) == s["bubble_ns"]

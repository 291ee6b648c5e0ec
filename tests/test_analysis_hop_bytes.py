"""Per-hop byte and time sums stay integers without a numpy warning, however absurd the recorded sizes; a hop
whose messages record no size has unknown bytes (None, `–`, JSON null), never 0."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ppscope.analysis import analyze
from ppscope.analysis.pipeline import hop_stats
from ppscope.analysis.report import render_text
from ppscope.formats.sources import open_trace
from ppscope.trace.model import Trace

CAPTURE = Path(__file__).parent / "data" / "pipelining" / "1f1b"

INT64_MAX = 2**63 - 1


def _spans(nbytes: int, n: int = 3) -> Trace:
    rows = []
    for i in range(n):
        rows.append(dict(rank=0, stage=0, kind="send", start_ns=10 * i, end_ns=10 * i + 2, peer=1, nbytes=nbytes))
        rows.append(dict(rank=1, stage=1, kind="recv", start_ns=10 * i, end_ns=10 * i + 3, peer=0, nbytes=nbytes))
    return Trace.from_records(rows)


def test_bytes_near_the_int64_limit_saturate_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from a cast would fail here
        (hop,) = hop_stats(_spans(INT64_MAX).spans)
        (neg,) = hop_stats(_spans(-INT64_MAX).spans)
        result = analyze(_spans(INT64_MAX))
    assert hop.nbytes is not None and INT64_MAX - 1024 <= hop.nbytes <= INT64_MAX  # saturated at the limit
    assert neg.nbytes is None  # a negative size is no size
    assert (hop.messages, hop.send_ns, hop.recv_ns) == (3, 6, 9)
    assert result.hops[0].nbytes == hop.nbytes


def test_ordinary_sums_stay_exact() -> None:
    (hop,) = hop_stats(_spans(2**40 + 1).spans)
    assert hop.nbytes == 3 * (2**40 + 1)


def test_a_hop_without_sizes_has_unknown_bytes_not_zero() -> None:
    result = analyze(_spans(0))
    (hop,) = result.hops
    assert hop.nbytes is None and hop.bandwidth_gb_per_s is None
    assert hop.unmeasured["nbytes"] == hop.unmeasured["bandwidth_gb_per_s"]  # why: the trace has no sizes
    assert result.to_json()["hops"][0]["nbytes"] is None
    text = render_text(result)
    (row,) = [line for line in text.split("Per-hop communication")[1].splitlines() if "0→1" in line and "│" in line]
    assert row.split("│")[3].strip() == "–"  # the MB cell
    assert "– MB, GB/s on 0→1: not measured, no message of the hop records its size" in text


def test_known_sizes_are_summed_whichever_side_records_them() -> None:
    trace = _spans(0)
    trace.spans.loc[trace.spans["kind"] == "recv", "nbytes"] = 512 * 1024  # only the receiver knows them
    (hop,) = analyze(trace).hops
    assert hop.nbytes == 3 * 512 * 1024 and "nbytes" not in hop.unmeasured
    trace.spans.loc[trace.spans.index[-1], "nbytes"] = 0  # one message without: the others still count
    (hop,) = analyze(trace).hops
    assert hop.nbytes == 2 * 512 * 1024


@pytest.mark.skipif(not CAPTURE.is_dir(), reason="the captures are not in this checkout")
def test_a_kineto_capture_without_message_sizes_prints_a_dash() -> None:
    result = analyze(open_trace(CAPTURE))
    assert result.hops and all(h.nbytes is None for h in result.hops)
    table = render_text(result).split("Per-hop communication")[1]
    rows = [line for line in table.splitlines() if "→" in line and "│" in line]
    assert rows and all(line.split("│")[3].strip() == "–" for line in rows)

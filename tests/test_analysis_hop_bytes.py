"""Per-hop byte and time sums stay integers without a numpy warning, however absurd the recorded sizes."""

from __future__ import annotations

import warnings

from ppscope.analysis import analyze
from ppscope.analysis.pipeline import hop_stats
from ppscope.trace.model import Trace

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
    assert INT64_MAX - 1024 <= hop.nbytes <= INT64_MAX  # three times the limit: saturated at it
    assert -(2**63) <= neg.nbytes <= -INT64_MAX + 1024
    assert (hop.messages, hop.send_ns, hop.recv_ns) == (3, 6, 9)
    assert result.hops[0].nbytes == hop.nbytes


def test_ordinary_sums_stay_exact() -> None:
    (hop,) = hop_stats(_spans(2**40 + 1).spans)
    assert hop.nbytes == 3 * (2**40 + 1)

"""Kineto's fast read: msgspec's typed batches give the values the plain decoder gives, times stay exact to the
ns in every column path, and damaged or truncated files still give one-line errors."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from error_helpers import raises_code

import ppscope.formats.kineto.decode as kineto_json
from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.formats.kineto.decode import event_of, iter_event_batches
from ppscope.formats.kineto.reader import load_kineto
from ppscope.formats.kineto.times import float_ns, ns_column, to_ns
from ppscope.trace.notices import NoticeCode

ODD_EVENTS = [
    {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 5,
        "dur": 1.25,
        "args": {"correlation": 3, "bytes": 64, "grid": [1, {"x": 2}], "blocks per SM": 0.5},
    },
    {
        "ph": "X",
        "cat": "kernel",
        "name": 12,
        "pid": [0],
        "tid": {"s": 1},
        "ts": "9",
        "dur": None,
        "args": ["not", "an", "object"],
    },  # types msgspec's Event does not take: the batch falls back
    {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1700000000123467.0395, "dur": 2},
    {"ph": "X", "cat": ["cpu_op"], "ts": 2**70},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": None}},
    {"ph": "s", "cat": "fwdbwd", "ts": 11.5, "id": 1},
    {"name": "\udc00 lone surrogate"},  # JSON the plain decoder takes and msgspec does not
    [1, 2],  # no event
]


def _plain(text: str) -> list[Any]:
    return [e for e in map(event_of, json.loads(text, parse_float=str)["traceEvents"]) if e is not None]


def _values(events: list[Any]) -> list[tuple[Any, ...]]:
    """Each event's fields, its duration as ns: a typed batch holds a float where the plain decode holds text."""
    ns = [int(ns_column([e.dur], Path("r.json"), "dur", lambda: [None])[0]) for e in events]
    return [(e.ph, e.cat, e.name, e.pid, e.tid, e.ts, d, e.args) for e, d in zip(events, ns, strict=True)]


@pytest.mark.parametrize("chunk", [7, 333, 1 << 20])
def test_typed_batches_hold_the_values_of_a_plain_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(kineto_json, "_CHUNK", chunk)
    events: list[Any] = ODD_EVENTS * 40
    for nan in (False, True):
        text = json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=1)
        if nan:  # NaN in one event's args: msgspec refuses that batch, the plain decoder reads it
            text = text.replace('"blocks per SM": 0.5', '"blocks per SM": NaN', 3)
        path = tmp_path / "odd.json"
        path.write_text(text)
        top: dict[str, Any] = {}
        got = [e for batch in iter_event_batches(path, top) for e in batch]
        assert _values(got) == _values(_plain(text)) and top == {"schemaVersion": 1}
        assert len(got) == 7 * 40 and got[0].args is not None and got[0].args.correlation == 3
        assert got[1].args is None and got[4].args is not None and got[4].args.correlation is None


def test_float_ts_with_many_digits_stays_exact_to_the_ns(tmp_path: Path) -> None:
    """Epoch µs with a fraction has more digits than a float holds; more than 3 decimals round half to even."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"r{i}", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1}
        for i in range(3)
    ]
    text = json.dumps({"traceEvents": events})
    for ts in ("1700000000123467.0395", "1700000000123467.0385", "1700000000123467.039"):
        text = text.replace('"ts": 0.0', f'"ts": {ts}', 1)
    (tmp_path / "rank0.json").write_text(text)
    spans = load_kineto([tmp_path / "rank0.json"]).spans.sort_values("name")
    assert spans["start_ns"].tolist() == [1700000000123467040, 1700000000123467038, 1700000000123467039]
    assert (spans["end_ns"] - spans["start_ns"]).tolist() == [1000, 1000, 1000]


@pytest.mark.parametrize(
    ("durations", "ns", "parsed"),
    [
        (["1.25", "68.0", "3", "999999999.999"], [1250, 68000, 3000, 999999999999], float),
        (["1.25", "0.0015000000000000000001"], [1250, 2], str),  # a float holds 0.0015: 1.5 ns, a tie
        (["1.25", "0.0025"], [1250, 2], str),  # 2.5 ns: to even
        (["1.25", "2.0005", "0.00049999999999999999999"], [1250, 2000, 0], str),
        (["1.25", "1000000000.5"], [1250, 1000000000500], str),  # 10^12 ns or more: the text
    ],
)
def test_float_durations_are_parsed_in_c_where_their_ns_are_sure(
    tmp_path: Path, durations: list[str], ns: list[int], parsed: type
) -> None:
    """A batch whose durations a float holds to the ns keeps them as floats (no text made in Python); one with a
    duration whose ns the float might round the other way is read again as text, and rounds half to even."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"r{i}", "pid": 1, "tid": 1, "ts": i, "dur": 0}
        for i in range(len(durations) + 1)
    ]
    text = json.dumps({"traceEvents": events})
    for d in durations:  # the last event is decoded alone (the stream's last item): a batch before it
        text = text.replace('"dur": 0}', '"dur": ' + d + "}", 1)
    path = tmp_path / "rank0.json"
    path.write_text(text)
    got = [e for b in iter_event_batches(path, {}) for e in b]
    assert {type(e.dur) for e in got[:-1] if "." in str(e.dur)} == {parsed}
    spans = load_kineto([path]).spans.sort_values("name")
    assert (spans["end_ns"] - spans["start_ns"]).tolist() == [*ns, 0]
    sure = float_ns([1.5, 2])
    assert sure is not None and sure.tolist() == [1500, 2000]
    assert float_ns([0.0005]) is None and float_ns([float("nan")]) is None and float_ns([1e9]) is None


@pytest.mark.parametrize(
    "values",
    [
        [1, 2, 1700000000123467],  # ints: numpy's path
        ["1.5", "68.0", "1.5", "1700000000123467.125", "2.0005", "1e3", "x", ""],  # float text, memo and not
        ["1.5", "68.", ".5", "-3.25", "+7", "1e3", "1E-3", "007.5"],  # float text of every shape
        ["4611686018427387.903", "-4611686018427387.903"],  # the last µs in range, either way
        ["1.5", "4611686018427387.904"],  # the first out of range: the second event named
        ["1.5", "-9223372036854775.808"],  # int64's least ns, whose absolute value int64 does not hold
        ["1.5", "١٢", "1_0", " 2"],  # text Decimal reads as a number
        [1, "2.5", None, True, [1], {"a": 1}, -3],  # mixed: a value at a time
        [1.25, 68.0, 3, 0.001],  # floats whose ns are sure: numpy's path
        [1.25, 2.0005, 0.0025, 1e9, 1e300, -0.5],  # and where they are not: a value at a time
        [2**62, 2**70],  # beyond int64: a value at a time, then out of range
    ],
)
def test_ns_column_is_to_ns_of_each_value(values: list[Any]) -> None:
    path = Path("r.json")
    names = [f"e{i}" for i in range(len(values))]
    try:
        expected: list[int] | str = [to_ns(v, path, "ts", n) for v, n in zip(values, names, strict=True)]
    except CorruptFileError as exc:
        expected = str(exc)
    for memo in (None, {}, {}):  # the second memo is already filled by the first call with it
        try:
            got: list[int] | str = ns_column(values, path, "ts", lambda: names, memo).tolist()
        except CorruptFileError as exc:
            got = str(exc)
        assert got == expected
    if isinstance(expected, str):
        named = [i for i, v in enumerate(values) if f"'e{i}'" in expected and repr(v) in expected]
        assert named and "\n" not in expected, expected  # an event, and its value


def _launch_doc(corr_of_odd_kernel: Any) -> dict[str, Any]:
    """Two steps; kernel k1 runs in step 2 but was launched in step 1 (correlation 1, launched twice: the last
    launch counts), k2 the other way round; one more kernel has an odd correlation id."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 100, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 50, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 120, "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 60, "dur": 5, "args": {"correlation": 2}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "odd",
            "pid": 0,
            "tid": 7,
            "ts": 130,
            "dur": 5,
            "args": {"correlation": corr_of_odd_kernel},
        },
    ]
    return {"traceEvents": events}


@pytest.mark.parametrize("odd", [3, None, "1", 2**70, True])
def test_gpu_work_takes_the_step_of_its_last_launch_whatever_other_ids_are(tmp_path: Path, odd: Any) -> None:
    """An id that is no int (or beyond int64) leaves the others' launches found: the id column is not
    converted as a whole. `True` is the id 1, as a dict key."""
    (tmp_path / "rank0.json").write_text(json.dumps(_launch_doc(odd)))
    spans = load_kineto([tmp_path / "rank0.json"]).spans.set_index("name")
    assert spans.loc["k1", "step"] == 1 and spans.loc["k2", "step"] == 2
    assert spans.loc["odd", "step"] == (1 if odd is True else 2)


@pytest.fixture(params=["isal", "zlib"])
def inflate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each gzip check made with ISA-L's inflate and with the standard library's, which is used where isal is
    not installed: the same contents, the same errors."""
    if request.param == "zlib":
        monkeypatch.setattr(kineto_json, "_zlib", zlib)
    else:
        assert kineto_json._zlib is not zlib, "isal is a dependency: pip install isal"
    return str(request.param)


@pytest.mark.usefixtures("inflate")
def test_truncated_and_damaged_gzip_give_one_line_errors(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1.5} for i in range(20_000)
    ]
    whole = gzip.compress(json.dumps({"traceEvents": events}).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE) as info:
        load_kineto([cut])
    assert "\n" not in str(info.value)
    damaged = bytearray(whole)
    damaged[len(whole) // 2 : len(whole) // 2 + 64] = bytes(64)
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(CorruptFileError) as info:
        load_kineto([bad])
    assert "\n" not in str(info.value)
    text = tmp_path / "cut.json"
    text.write_bytes(gzip.decompress(whole)[:300_000])
    with raises_code(CorruptFileError, ErrorCode.NOT_JSON):
        load_kineto([text])


def test_a_column_read_in_batches_is_the_same_as_one_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durations remembered across batches (the memo) and ints in numpy give what one batch gives."""
    rng = np.random.default_rng(1)
    ts, durs = np.cumsum(rng.integers(1, 9, 3000)).tolist(), rng.choice([1.5, 2.0, 2.125], 3000).tolist()
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1 + i % 2, "ts": ts[i], "dur": durs[i]}
        for i in range(3000)
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    whole = load_kineto([path])
    monkeypatch.setattr(kineto_json, "_CHUNK", 1000)
    pieces = load_kineto([path])
    assert whole.spans.equals(pieces.spans)
    assert whole.spans["start_ns"].iloc[0] == events[0]["ts"] * 1000


def test_bytes_beyond_int64_read_as_none_moved(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 9,
            "ts": t,
            "dur": 1,
            "args": {"bytes": n},
        }
        for t, n in ((1, 4096), (5, 2**70), (9, -(2**63)), (13, "12"))
    ]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    spans = load_kineto([tmp_path / "rank0.json"]).spans
    assert spans.loc[spans["kind"] == "memcpy", "nbytes"].tolist() == [4096, 0, -(2**63), 0]


def _nested_events(n: int) -> list[dict[str, Any]]:
    """Events whose args hold objects followed by more keys (`}, "`), and lists of objects (`}, {`)."""
    return [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{i} ü",
            "pid": 0,
            "tid": 7,
            "ts": i,
            "dur": 1.5,
            "args": {"grid": {"x": i}, "shape": [{"a": 1}, {"b": 2}], "correlation": i},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("chunk", [64, 1000, 4096])
def test_batches_cut_only_between_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Pieces end anywhere, inside nested objects too: each batch still ends between two events, so the file is
    decoded a few batches at a time (not an event at a time after a bad cut) and to the same events."""
    monkeypatch.setattr(kineto_json, "_CHUNK", chunk)
    text = json.dumps(
        {"traceEvents": _nested_events(400), "deviceProperties": [{"name": "é" * 5000}]}, ensure_ascii=False
    )
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    top: dict[str, Any] = {}
    batches = list(iter_event_batches(path, top))
    assert _values([e for b in batches for e in b]) == _values(_plain(text))
    assert top == {"deviceProperties": [{"name": "é" * 5000}]}
    if chunk >= 1000:  # pieces that hold a few events each: a few events a batch, not one
        assert len(batches) < 400 / 3


@pytest.mark.usefixtures("inflate")
def test_gzip_members_padding_and_damage(tmp_path: Path) -> None:
    """A gzip file of several members (and zeros after one) reads as their contents joined; a wrong checksum
    or a cut member is a one-line error."""
    text = json.dumps({"schemaVersion": 1, "traceEvents": _nested_events(300)}).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text[:5000]) + bytes(16) + gzip.compress(text[5000:]))
    top: dict[str, Any] = {}
    assert _values([e for b in iter_event_batches(path, top) for e in b]) == _values(_plain(text.decode()))
    whole = bytearray(gzip.compress(text))
    whole[-6] ^= 0xFF  # the CRC of the content
    path.write_bytes(bytes(whole))
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE) as info:
        load_kineto([path])
    assert "\n" not in str(info.value)
    path.write_bytes(gzip.compress(text[:5000]) + gzip.compress(text[5000:])[:-30])
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE):
        load_kineto([path])


def test_a_reader_stopped_early_leaves_no_thread(tmp_path: Path) -> None:
    """A file that is no trace stops at its first value; its reading thread stops with it."""
    (tmp_path / "config.json").write_text(json.dumps([{"lr": 1}] * 100_000))
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": _nested_events(10)}))
    trace = load_kineto([tmp_path / "config.json", tmp_path / "rank0.json"])
    assert len(trace.spans) == 10 and NoticeCode.SKIPPED_FILES in {w.code for w in trace.warnings}
    assert not [t for t in threading.enumerate() if t.name == "kineto-read"]


def test_a_streamed_file_is_inflated_after_the_one_before_it(tmp_path: Path) -> None:
    """The next file's reader waits for the reader of the file decoded first before a streamed inflate, where
    the two would share one core; a small file inflated at once does not wait."""
    first = tmp_path / "rank0.json"
    first.write_bytes(b" " * (24 * kineto_json._READ))  # more pieces than wait ahead: its thread stays busy
    streamed, small = tmp_path / "rank1.json.gz", tmp_path / "rank2.json.gz"
    streamed.write_bytes(gzip.compress(b"{") + gzip.compress(b"}"))  # two members: streamed
    small.write_bytes(gzip.compress(b"{}"))
    for second, waits in ((streamed, True), (small, False)):
        before = kineto_json.ReadAhead(first)
        after = kineto_json.ReadAhead(second, after=before)
        try:
            after.thread.join(timeout=0.3)
            assert before.thread.is_alive() and after.pieces.empty() == waits  # held back while the first is read
            while before.take(1 << 30):
                pass
            got = after.take(1 << 30)
            got += after.take(1 << 30)  # two members: their pieces may come in two takes
            assert got == b"{}"
        finally:
            before.close()
            after.close()


@pytest.mark.usefixtures("inflate")
def test_a_small_gzip_file_of_one_member_is_inflated_at_once(tmp_path: Path) -> None:
    """One member and nothing after it: inflated by one call. Zeros or other bytes after it, or another member:
    streamed, which reads the zeros as padding and names the rest as damage."""
    text = json.dumps({"schemaVersion": 1, "traceEvents": _nested_events(300)}).encode()
    member = gzip.compress(text)
    expected = _values(_plain(text.decode()))
    for tail, at_once in ((b"", True), (bytes(16), False), (gzip.compress(b" "), False)):
        path = tmp_path / "rank0.json.gz"
        path.write_bytes(member + tail)
        with path.open("rb") as raw:
            got = kineto_json._inflated_at_once(raw)
            if at_once:
                assert got == text
            else:  # streamed, from the start
                assert got is None and raw.tell() == 0, tail
        assert _values([e for b in iter_event_batches(path, {}) for e in b]) == expected
    for damaged in (member + b"x", member[:-30]):  # bytes after the member; a cut member
        path.write_bytes(damaged)
        with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE):
            load_kineto([path])

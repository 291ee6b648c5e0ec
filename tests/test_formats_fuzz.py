"""Bad input, many at a time: property tests of every importer and of `load_run`.

Each case copies a real file (the third-party traces in ../shared/data, or a run the engine just recorded)
into a fresh directory, damages it (truncation, bit flips, overwritten bytes, random bytes, JSON with wrong
types or missing fields) and loads it. Every case must end in a named ppscope error or a Trace the
analyzer takes; no other exception, no hang, no write to the input. Cases are derandomized: the same ones
run every time. `pytest -s` prints how many ran.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzz_helpers import CASES, DATA, FUZZ, OUTCOMES, check_input, examples, mutated
from hypothesis import given, settings
from hypothesis import strategies as st

from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
from ppscope.engine.launch import run
from ppscope.formats.nsys.writer import export_nsys
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run

pytestmark = pytest.mark.timeout(240)

NSYS_SMALL = DATA / "nsys" / "mock.sqlite"
NSYS_BIG = DATA / "nsys" / "mfu_2gpu_after.sqlite"
KINETO = DATA / "kineto" / "trace_filter" / "sampled_rank-0.json.gz"
KINETO_1 = DATA / "kineto" / "trace_filter" / "sampled_rank-1.json.gz"

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"the real traces are not here ({DATA} is absent)")

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module", autouse=True)
def _tally() -> Iterator[None]:
    yield
    print(f"\nbad-input cases run: {sum(CASES.values())}")
    for name, outcomes in OUTCOMES.items():
        print(f"  {name}: {CASES[name]} cases, {dict(outcomes)}")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small two-stage run recorded by the engine (spans, counters, requests)."""
    out = tmp_path_factory.mktemp("recorded") / "run"
    run(
        EngineConfig(
            pipeline=PipelineConfig(stages=2, schedule="serve"),
            model=ModelConfig(name="synthetic", layers=2, layer_cost_ms=(0.0,)),
            workload=WorkloadConfig(requests=6, max_new_tokens=4),
            output=OutputConfig(progress=False, out=out),
        )
    )
    return out


def _copy_in(src: Path, tmp: Path, name: str | None = None) -> Path:
    dst = tmp / (name or src.name)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst


# ---------------------------------------------------------------- nsys SQLite


@needs_data
@settings(FUZZ, max_examples=examples(120))
@given(data=st.data())
def test_damaged_nsys_export(data: st.DataObject) -> None:
    original = NSYS_SMALL.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.sqlite"
        path.write_bytes(data.draw(mutated(original)))
        check_input("nsys mock.sqlite", path, open_trace)


@pytest.mark.slow
@needs_data
@settings(FUZZ, max_examples=examples(30))
@given(data=st.data())
def test_damaged_big_nsys_export(data: st.DataObject) -> None:
    original = NSYS_BIG.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.sqlite"
        path.write_bytes(data.draw(mutated(original)))
        check_input("nsys mfu_2gpu_after.sqlite", path, open_trace)


# ---------------------------------------------------------------- Kineto JSON / JSON.gz


@needs_data
@settings(FUZZ, max_examples=examples(80))
@given(data=st.data(), as_gzip=st.booleans())
def test_damaged_kineto_bytes(data: st.DataObject, as_gzip: bool) -> None:
    """Damage to the compressed file (gzip errors) and to the JSON text inside (syntax, encoding)."""
    raw = KINETO.read_bytes() if as_gzip else gzip.decompress(KINETO.read_bytes())
    damaged = data.draw(mutated(raw))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("rank-0.json.gz" if as_gzip else "rank-0.json")
        path.write_bytes(damaged)
        check_input("kineto bytes", path, open_trace)


@pytest.fixture(scope="module")
def kineto_doc() -> dict[str, Any]:
    if not DATA.is_dir():
        pytest.skip(f"the real traces are not here ({DATA} is absent)")
    doc: dict[str, Any] = json.loads(gzip.decompress(KINETO.read_bytes()))
    return doc


EVENT_KEYS = ["ph", "name", "ts", "dur", "pid", "tid", "args", "cat", "id", "bp", "s"]
TOP_KEYS = ["traceEvents", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "deviceProperties"]


def _reshape(data: st.DataObject, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with a few values replaced by wrong types, or fields removed, at the top, in events or args."""
    doc = copy.copy(doc)
    events = list(doc.get("traceEvents", []))
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        where = data.draw(st.sampled_from(["top", "event", "args", "events"]), label="where")
        delete = data.draw(st.booleans(), label="delete")
        value = None if delete else data.draw(JSON_VALUES, label="value")
        if where == "events":
            doc["traceEvents"] = events = value if not delete else []  # type: ignore[assignment]
            continue
        if where == "top":
            target: Any = doc
            key = data.draw(st.sampled_from(TOP_KEYS) | st.text(max_size=4), label="key")
        elif not isinstance(events, list) or not events:
            continue
        else:
            i = data.draw(st.integers(0, len(events) - 1), label="event")
            events[i] = target = dict(events[i]) if isinstance(events[i], dict) else {}
            key = data.draw(st.sampled_from(EVENT_KEYS), label="key")
            if where == "args":
                target["args"] = target = dict(target.get("args") or {}) if isinstance(target.get("args"), dict) else {}
                key = data.draw(st.sampled_from(["rank", "stream", "device", "External id", "In msg nelems"]))
        if delete:
            target.pop(key, None)
        else:
            target[key] = value
        if where != "top":
            doc["traceEvents"] = events
    return doc


@pytest.mark.slow
@needs_data
@settings(FUZZ, max_examples=examples(150))
@given(data=st.data())
def test_kineto_with_wrong_types_and_missing_fields(kineto_doc: dict[str, Any], data: st.DataObject) -> None:
    doc = _reshape(data, kineto_doc)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.json"
        path.write_text(json.dumps(doc))
        check_input("kineto shapes", path, open_trace)


# ---------------------------------------------------------------- Megatron-style timer traces

TIMERS = Path(__file__).resolve().parent / "data" / "megatron-timers" / "last-stage-slow.json.gz"
TIMER_ARGS = ["step", "mb_id", "model_chunk", "seq_id", "name", "pp_rank", "tp_rank", "dp_rank"]


@settings(FUZZ, max_examples=examples(60))
@given(data=st.data(), as_gzip=st.booleans())
def test_damaged_timer_trace_bytes(data: st.DataObject, as_gzip: bool) -> None:
    """Damage to a timer trace's gzip and to its bare array's text."""
    raw = TIMERS.read_bytes() if as_gzip else gzip.decompress(TIMERS.read_bytes())
    damaged = data.draw(mutated(raw))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("timeline.json.gz" if as_gzip else "timeline.json")
        path.write_bytes(damaged)
        check_input("timer bytes", path, open_trace)


@settings(FUZZ, max_examples=examples(80))
@given(data=st.data())
def test_timer_trace_with_wrong_types_and_missing_fields(data: st.DataObject) -> None:
    """A timer trace's events and their args with values of other types, or fields removed."""
    events: list[Any] = json.loads(gzip.decompress(TIMERS.read_bytes()))
    for _ in range(data.draw(st.integers(1, 6), label="edits")):
        i = data.draw(st.integers(0, len(events) - 1), label="event")
        events[i] = target = dict(events[i])
        if data.draw(st.booleans(), label="in args") and isinstance(target.get("args"), dict):
            target["args"] = target = dict(target["args"])
            key = data.draw(st.sampled_from(TIMER_ARGS), label="key")
        else:
            key = data.draw(st.sampled_from(EVENT_KEYS), label="key")
        if data.draw(st.booleans(), label="delete"):
            target.pop(key, None)
        else:
            target[key] = data.draw(JSON_VALUES, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json"
        path.write_text(json.dumps(events))
        check_input("timer shapes", path, open_trace)


@settings(FUZZ, max_examples=examples(60))
@given(data=st.data())
def test_primus_dump_with_wrong_types_and_missing_fields(data: st.DataObject) -> None:
    """A Primus pipeline dump whose iterations hold values of other types, or lack fields."""
    it = {"total": 9.0, "fwd_start": [0.0, 2.0], "fwd_end": [1.0, 3.0], "bwd_start": [4.0, 6.0]}
    it |= {"bwd_end": [5.5, 7.5], "fwd_minibatch": [0, 1], "bwd_minibatch": [0, 1], "fwd_chunk": [0, 0]}
    dump: dict[str, Any] = {"1": dict(it), "2": dict(it)}
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        step = data.draw(st.sampled_from(["1", "2"]), label="iteration")
        key = data.draw(st.sampled_from([*it, "wgrad_start", "wgrad_end"]), label="key")
        if data.draw(st.booleans(), label="delete"):
            dump[step].pop(key, None)
        else:
            dump[step][key] = data.draw(JSON_VALUES, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pp_rank_0.json").write_text(json.dumps(dump))
        (Path(tmp) / "pp_rank_1.json").write_text(json.dumps({"1": it, "2": it}))
        (Path(tmp) / "config.json").write_text(json.dumps({"pp_size": 2, "num_mbs": 2}))
        check_input("primus shapes", Path(tmp), open_trace)


@needs_data
@settings(FUZZ, max_examples=examples(30))
@given(data=st.data())
def test_kineto_directory_with_one_damaged_rank(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "traces"
        folder.mkdir()
        _copy_in(KINETO, folder)
        (folder / KINETO_1.name).write_bytes(data.draw(mutated(KINETO_1.read_bytes())))
        check_input("kineto directory", folder, open_trace)


# ---------------------------------------------------------------- our own runs


@pytest.mark.slow
@settings(FUZZ, max_examples=examples(80))
@given(data=st.data(), rank=st.integers(0, 1))
def test_run_with_a_damaged_rank_file(recorded: Path, data: st.DataObject, rank: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _copy_in(recorded, Path(tmp))
        path = run_dir / f"rank-{rank:05d}.sqlite"
        path.write_bytes(data.draw(mutated(path.read_bytes())))
        check_input("run rank file", run_dir, load_run)


@settings(FUZZ, max_examples=examples(60))
@given(data=st.data(), name=st.sampled_from(["meta.json", "requests.jsonl"]))
def test_run_with_damaged_json_bytes(recorded: Path, data: st.DataObject, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _copy_in(recorded, Path(tmp))
        path = run_dir / name
        path.write_bytes(data.draw(mutated(path.read_bytes())))
        check_input(f"run {name} bytes", run_dir, open_trace)


META_PATHS = [
    ("backend",),
    ("chunks",),
    ("config",),
    ("created_unix_ns",),
    ("error",),
    ("microbatches",),
    ("model",),
    ("pp_size",),
    ("ranks",),
    ("run_id",),
    ("schedule",),
    ("schema_version",),
    ("source",),
    ("split",),
    ("split_source",),
    ("status",),
    ("versions",),
    ("world_size",),
    ("ranks", 0),
    ("ranks", 0, "clock"),
    ("ranks", 0, "rank"),
    ("ranks", 0, "stage"),
    ("ranks", 0, "pid"),
    ("ranks", 1, "clock", "offset_ns"),
    ("ranks", 1, "clock", "uncertainty_ns"),
    ("ranks", 1, "device"),
    ("split", 0),
    ("model", "layers"),
]


def _set_path(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    for step in path[:-1]:
        try:
            doc = doc[step]
        except (KeyError, IndexError, TypeError):
            return
    try:
        if delete:
            del doc[path[-1]]
        else:
            doc[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        return


@settings(FUZZ, max_examples=examples(120))
@given(data=st.data())
def test_run_meta_with_wrong_types_and_missing_fields(recorded: Path, data: st.DataObject) -> None:
    meta = json.loads((recorded / "meta.json").read_text())
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        path = data.draw(st.sampled_from(META_PATHS), label="path")
        delete = data.draw(st.booleans(), label="delete")
        _set_path(meta, path, None if delete else data.draw(JSON_VALUES, label="value"), delete)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _copy_in(recorded, Path(tmp))
        (run_dir / "meta.json").write_text(json.dumps(meta))
        check_input("run meta shapes", run_dir, load_run)


@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
def test_run_requests_with_wrong_types(recorded: Path, data: st.DataObject) -> None:
    lines = [json.loads(line) for line in (recorded / "requests.jsonl").read_text().splitlines()]
    i = data.draw(st.integers(0, len(lines) - 1))
    key = data.draw(st.sampled_from(["id", "prompt_len", "output_len", "arrival_ns", "first_token_ns", "finish_ns"]))
    if data.draw(st.booleans()):
        lines[i].pop(key, None)
    else:
        lines[i][key] = data.draw(JSON_VALUES)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _copy_in(recorded, Path(tmp))
        (run_dir / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        check_input("run requests shapes", run_dir, load_run)


# ---------------------------------------------------------------- wrongly typed cells in SQLite files

READ_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "StringIds",
    "META_DATA_EXPORT",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_DEVICE",
    "TARGET_INFO_SESSION_START_TIME",
    "spans",
    "counters",
    "info",
}
"""The tables the importers read: damage lands there most of the time."""

SQL_VALUES = (
    st.none()
    | st.integers(-(2**63), 2**63 - 1)
    | st.sampled_from([0, -1, 2**63 - 1, -(2**63), 1 << 62])
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)


def _damage_cells(path: Path, data: st.DataObject) -> str:
    """In a copy of an SQLite file: give a column a wrong value in some rows, empty a table, or drop a table
    or a column. Returns what was done (for the failure report)."""
    db = sqlite3.connect(path)
    try:
        tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        tables = [t for t in tables if not t.startswith("sqlite_")]
        read = [t for t in tables if t in READ_TABLES] or tables
        table = data.draw(st.sampled_from(read) | st.sampled_from(tables), label="table")
        columns = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
        column = data.draw(st.sampled_from(columns), label="column")
        how = data.draw(st.sampled_from(["set", "set", "set", "set all", "empty", "drop table", "drop column"]))
        with contextlib.suppress(sqlite3.Error):  # a schema that refuses the edit: load it unchanged
            if how == "set":
                value = data.draw(SQL_VALUES, label="value")
                rows = data.draw(st.integers(1, 20), label="rows")
                db.execute(
                    f'UPDATE "{table}" SET "{column}" = ? WHERE rowid IN '
                    f'(SELECT rowid FROM "{table}" ORDER BY random() LIMIT ?)',
                    (value, rows),
                )
            elif how == "set all":
                db.execute(f'UPDATE "{table}" SET "{column}" = ?', (data.draw(SQL_VALUES, label="value"),))
            elif how == "empty":
                db.execute(f'DELETE FROM "{table}"')
            elif how == "drop table":
                db.execute(f'DROP TABLE "{table}"')
            else:
                db.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
        db.commit()
    finally:
        db.close()
    return f"{how} {table}.{column}"


@pytest.mark.slow
@needs_data
@settings(FUZZ, max_examples=examples(150))
@given(data=st.data())
def test_nsys_export_with_wrong_cells(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _copy_in(NSYS_SMALL, Path(tmp), "trace.sqlite")
        _damage_cells(path, data)
        check_input("nsys mock.sqlite cells", path, open_trace)


@pytest.mark.slow
@needs_data
@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
def test_big_nsys_export_with_wrong_cells(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _copy_in(NSYS_BIG, Path(tmp), "trace.sqlite")
        _damage_cells(path, data)
        check_input("nsys mfu_2gpu_after.sqlite cells", path, open_trace)


@pytest.mark.slow
@settings(FUZZ, max_examples=examples(150))
@given(data=st.data(), rank=st.integers(0, 1))
def test_run_rank_file_with_wrong_cells(recorded: Path, data: st.DataObject, rank: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = _copy_in(recorded, Path(tmp))
        _damage_cells(run_dir / f"rank-{rank:05d}.sqlite", data)
        check_input("run rank file cells", run_dir, load_run)


@pytest.fixture(scope="module")
def own_export(recorded: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded run exported as an nsys SQLite file by ppscope (read back through its own-export path)."""
    return export_nsys(load_run(recorded), tmp_path_factory.mktemp("export") / "run.nsys.sqlite")


@pytest.mark.slow
@settings(FUZZ, max_examples=examples(100))
@given(data=st.data())
def test_own_nsys_export_with_wrong_cells(own_export: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _copy_in(own_export, Path(tmp), "trace.sqlite")
        _damage_cells(path, data)
        check_input("own nsys export cells", path, open_trace)


@settings(FUZZ, max_examples=examples(60))
@given(data=st.data())
def test_own_nsys_export_damaged(own_export: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.sqlite"
        path.write_bytes(data.draw(mutated(own_export.read_bytes())))
        check_input("own nsys export bytes", path, open_trace)


def test_span_ending_before_it_starts_is_left_out_with_a_warning(recorded: Path, tmp_path: Path) -> None:
    run_dir = _copy_in(recorded, tmp_path)
    whole = len(load_run(run_dir).spans)
    db = sqlite3.connect(run_dir / "rank-00001.sqlite")
    db.execute("UPDATE spans SET end_ns = start_ns - 5 WHERE id IN (1, 2)")
    db.commit()
    db.close()
    trace = load_run(run_dir)
    assert len(trace.spans) == whole - 2
    (reversed_,) = [n.text for n in trace.warnings if n.code == NoticeCode.SPANS_REVERSED]
    assert reversed_.startswith("2 ") and "rank-00001.sqlite" in reversed_  # counted, and the file named

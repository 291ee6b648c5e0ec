"""AMD Primus' pipeline dumps (`pp_rank_N.json`, `--dump_pp_data`): detection of the folder and of one file,
the reader's ranks, steps and micro-batches, and the slow stage `analyze` finds. The dumps are written here
from the public format (Primus' `dump_pp_data`), their timings from the Megatron-style generator's 1F1B
simulation."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from error_helpers import raises_code

from ppscope.analysis.analyzer import analyze
from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.formats.detect import InputKind, detect
from ppscope.formats.sources import open_trace
from ppscope.trace.model import SpanKind
from ppscope.trace.notices import NoticeCode

ROOT = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_timers", ROOT / "scripts" / "megatron_timers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["megatron_timers"] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _dump(folder: Path, *, stages: int = 4, mbs: int = 4, with_ids: bool = True) -> Path:
    """A Primus dump of one replica: the last stage 1.6x slower; times in ms since each iteration's start."""
    job = GEN.Job(replicas=1, stages=stages, microbatches=mbs, steps=2, mb_ms={(stages - 1, 0): 345.0})
    spans = GEN.spans_of(job)
    folder.mkdir()
    begin = {step: min(a for ss in spans.values() for _, a, _, _, st in ss if st == step) for step in (1, 2)}
    for (stage, _), ss in spans.items():
        dump: dict[str, Any] = {}
        for step in (1, 2):
            it: dict[str, Any] = {"total": 0.0, "memory": 1.0}
            for name, key in (("forward-compute", "fwd"), ("backward-compute", "bwd")):
                mine = [(a, b, mb) for n, a, b, mb, st in ss if n == name and st == step]
                it[f"{key}_start"] = [(a - begin[step]) / 1000 for a, _, _ in mine]
                it[f"{key}_end"] = [(b - begin[step]) / 1000 for _, b, _ in mine]
                if with_ids:
                    it[f"{key}_minibatch"] = [mb for *_, mb in mine]
                    it[f"{key}_chunk"] = [0 for _ in mine]
            it["total"] = max(it["bwd_end"])
            dump[str(step)] = it
        (folder / f"pp_rank_{stage}.json").write_text(json.dumps(dump, indent=2))
    config = {"world_size": stages, "dp_size": 1, "tp_size": 1, "pp_size": stages, "vp_size": 1, "num_mbs": mbs}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_and_one_file_of_a_dump_are_primus(tmp_path: Path) -> None:
    folder = _dump(tmp_path / "pp_data")
    assert detect(folder).kind == InputKind.PRIMUS
    assert detect(folder / "pp_rank_1.json").kind == InputKind.PRIMUS
    assert detect(folder / "config.json").kind == InputKind.KINETO  # alone, it is no dump: the Kineto reader says so


def test_the_reader_gives_stages_steps_microbatches_and_the_schedule(tmp_path: Path) -> None:
    trace = open_trace(_dump(tmp_path / "pp_data"))
    meta = trace.meta
    assert (meta.source, meta.pp_size, meta.microbatches, meta.schedule) == ("primus", 4, 4, "1f1b")
    s = trace.spans
    assert sorted(s["rank"].unique().tolist()) == [0, 1, 2, 3] and sorted(s["step"].unique().tolist()) == [1, 2]
    assert (s["kind"] == SpanKind.FORWARD).sum() == (s["kind"] == SpanKind.BACKWARD).sum() == 4 * 4 * 2
    assert any(w.code == NoticeCode.IMPORT_CLOCKS for w in trace.warnings)


def test_analyze_names_the_slow_last_stage(tmp_path: Path) -> None:
    result = analyze(open_trace(_dump(tmp_path / "pp_data")))
    assert result.bottleneck_stage == 3
    per_mb = {st.stage: st.time_per_mb_ns for st in result.stages}
    assert per_mb[3] == pytest.approx(345e6, rel=1e-3) and per_mb[0] == pytest.approx(212e6, rel=1e-3)


def test_an_older_dump_without_ids_numbers_micro_batches_in_order(tmp_path: Path) -> None:
    trace = open_trace(_dump(tmp_path / "pp_data", with_ids=False))
    assert any(w.code == NoticeCode.PRIMUS_MICROBATCHES_GUESSED for w in trace.warnings)
    f = trace.spans[trace.spans["kind"] == SpanKind.FORWARD]
    assert f.groupby(["rank", "step"])["mb"].apply(list).map(lambda m: m == [0, 1, 2, 3]).all()


def test_a_damaged_rank_file_is_one_line(tmp_path: Path) -> None:
    folder = _dump(tmp_path / "pp_data")
    (folder / "pp_rank_2.json").write_text('{"1": {"fwd_start": [1.0, 2.0')
    with raises_code(CorruptFileError, ErrorCode.NOT_JSON) as err:
        open_trace(folder)
    assert "\n" not in str(err.value) and "pp_rank_2.json" in str(err.value)  # the damaged file

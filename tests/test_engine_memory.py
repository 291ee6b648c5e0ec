"""A run that cannot fit is refused before anything starts, in one line; the estimate is what ranks allocate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from error_helpers import cli_error, raises_code

from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
from ppscope.engine.prepare import check_memory, host_available_bytes, make_source, prepare, torch_dtype
from ppscope.engine.requests import GeneratedRequests
from ppscope.engine.stage import build_stage
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.notices import NoticeCode


@pytest.mark.parametrize(
    ("stages", "chunks", "dtype"), [(1, 1, "float32"), (2, 1, "bfloat16"), (2, 2, "float32"), (1, 1, "float64")]
)
def test_estimate_is_what_each_rank_allocates(stages: int, chunks: int, dtype: str) -> None:
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=stages, chunks=chunks, schedule="interleaved" if chunks > 1 else "serve"),
        model=ModelConfig(dtype=dtype),
        workload=WorkloadConfig(requests=3, prompt_len=6, max_new_tokens=5),
        output=OutputConfig(progress=False),
    )
    prep = prepare(cfg, stages)
    for rank in range(stages):
        stage = build_stage(
            make_source(cfg, prep.shape), prep.split, rank, stages, chunks, torch.device("cpu"), torch_dtype(dtype)
        )
        stage.allocate_cache(
            prep.cache_slots, prep.max_len, torch_dtype(dtype), prep.shape.kv_heads, prep.shape.head_dim
        )
        modules = [m for c in stage.chunks.values() for m in c.layers] + [m for m in (stage.embed, stage.head) if m]
        weights = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        kv = sum(t.numel() * t.element_size() for c in stage.chunks.values() for kc in c.caches for t in (kc.k, kc.v))
        assert prep.rank_bytes(rank, stages) == (weights, kv)


def test_run_that_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = EngineConfig(pipeline=PipelineConfig(stages=2), output=OutputConfig(progress=False, out=tmp_path / "run"))
    prep = prepare(cfg, 2)
    check_memory(prep, [0, 1], 2, 10 << 30, "this host", processes=True)  # fits
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY) as err:
        check_memory(prep, [0, 1], 2, 100 << 20, "this host", processes=True)
    text = str(err.value)
    assert all(name in text for name in ("tiny", "float32", "this host", "0.1 GiB")) and "\n" not in text, text
    assert "ppscope plan --model tiny" in text  # the command that sizes it without running it
    synthetic = prepare(EngineConfig(pipeline=PipelineConfig(stages=2), model=ModelConfig(name="synthetic")), 2)
    check_memory(synthetic, [0, 1], 2, 1, "GPU 0", processes=False)  # sleeps: nothing to hold


def test_launcher_refuses_before_creating_the_run(tmp_path: Path) -> None:
    from ppscope.engine.launch import run

    available = host_available_bytes()
    if available is None:
        pytest.skip("no /proc/meminfo here")
    # a preset whose float32 weights alone are several times this host's free memory, by its old name: the
    # engine builds the preset it was renamed to
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2),
        model=ModelConfig(name="llama3-405b"),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        run(cfg)
    assert not (tmp_path / "run").exists()


def test_run_by_the_old_preset_name_says_it_was_renamed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    if host_available_bytes() is None:
        pytest.skip("no /proc/meminfo here")
    from ppscope.balance.modelled.shapes import renamed_note

    failed = cli_error(capsys, ["run", "--model", "llama3-405b", "--stages", "2", "--out", str(tmp_path / "run")])
    note = renamed_note("llama3-405b")
    assert note is not None and note.code == NoticeCode.RENAMED_PRESET and f"note: {note.text}" in failed.err
    assert failed.code == ErrorCode.NOT_ENOUGH_MEMORY and "llama3.1-405b" in failed.text  # as the new name would be


def test_millions_of_generated_requests_are_refused_before_any_is_made(tmp_path: Path) -> None:
    from ppscope.engine.launch import run

    if host_available_bytes() is None:
        pytest.skip("no /proc/meminfo here")
    # gpipe holds every request's KV cache; 2M of them took 34 s and 2.3 GB to make before this refusal
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2, schedule="gpipe"),
        workload=WorkloadConfig(requests=2_000_000),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    prep = prepare(cfg, 2)
    assert len(prep.requests) == 2_000_000 and prep.cache_slots == 2_000_000 and prep.max_len == 16 + 8
    assert isinstance(prep.requests, GeneratedRequests) and prep.requests.made == 0
    assert "arrivals_ns" not in vars(prep)  # made by rank 0 when it starts serving, not by every process
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        run(cfg)
    assert not (tmp_path / "run").exists()

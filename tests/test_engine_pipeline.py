"""The pipelined engine generates exactly what the unsplit model generates, for every schedule and 1-4
stages on CPU (gloo), and writes the run store the analyzer reads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ppscope.engine.config import EngineConfig, OutputConfig, PipelineConfig, RuntimeConfig, WorkloadConfig
from ppscope.engine.launch import run
from ppscope.engine.reference import reference_outputs
from ppscope.trace.model import SpanKind
from ppscope.trace.store import load_run, read_meta

REQUESTS = WorkloadConfig(requests=5, prompt_len=5, max_new_tokens=3, seed=3)


def _config(out: Path, pipeline: PipelineConfig, workload: WorkloadConfig = REQUESTS) -> EngineConfig:
    return EngineConfig(
        pipeline=pipeline,
        workload=workload,
        output=OutputConfig(progress=False, out=out),
        runtime=RuntimeConfig(timeout_s=60),
    )


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    return reference_outputs(EngineConfig(pipeline=PipelineConfig(stages=1), workload=REQUESTS))


def _outputs(run_dir: Path) -> list[list[int]]:
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    return [r["output_ids"] for r in sorted(lines, key=lambda r: r["id"])]


CASES = [
    pytest.param(schedule, stages, marks=[pytest.mark.slow] if stages >= 3 else [], id=f"{schedule}-{stages}")
    for schedule in ("gpipe", "interleaved", "serve")
    for stages in (1, 2, 3, 4)
]


@pytest.mark.parametrize(("schedule", "stages"), CASES)
def test_pipeline_output_equals_unsplit_model(
    schedule: str, stages: int, expected: list[list[int]], tmp_path: Path
) -> None:
    chunks = 2 if schedule == "interleaved" else 1
    cfg = _config(tmp_path / "run", PipelineConfig(stages=stages, schedule=schedule, chunks=chunks))
    run_dir = run(cfg)
    assert _outputs(run_dir) == expected
    meta = read_meta(run_dir)
    assert (meta.status, meta.pp_size, meta.chunks, meta.schedule) == ("finished", stages, chunks, schedule)
    assert sum(meta.split) == 8 and len(meta.split) == stages * chunks
    assert meta.split_source == "vllm-default"
    assert [r.rank for r in meta.ranks] == list(range(stages))
    trace = load_run(run_dir)
    spans = trace.spans
    fwd = spans[spans["kind"] == SpanKind.FORWARD]
    # every virtual stage ran every micro-batch pass: 5 requests x 3 tokens in some grouping
    assert sorted(fwd["stage"].unique()) == list(range(stages * chunks))
    assert (fwd["chunk"] == fwd["stage"] // stages).all()
    assert set(spans[spans["kind"] == SpanKind.EMBED]["rank"]) == {0}
    assert set(spans[spans["kind"] == SpanKind.HEAD]["rank"]) == {stages - 1}
    for kind in (SpanKind.HEAD, SpanKind.SAMPLE):  # a row per sequence: what the analyzer counts as generated
        assert spans[spans["kind"] == kind]["tokens"].sum() == 5 * 3, kind
    assert set(fwd["phase"]) == {"prefill", "decode"}
    if stages > 1:
        sends = spans[spans["kind"] == SpanKind.SEND]
        assert ((sends["peer"] - sends["rank"]) % stages == 1).all() and (sends["nbytes"] > 0).all()
        waits = spans[spans["kind"] == SpanKind.RECV_WAIT]
        assert ((waits["rank"] - waits["peer"]) % stages == 1).all()
    reqs = trace.requests
    assert len(reqs) == 5 and (reqs["output_len"] == 3).all()
    assert (reqs["first_token_ns"] >= reqs["arrival_ns"]).all() and (reqs["finish_ns"] >= reqs["first_token_ns"]).all()
    if stages > 1:  # each micro-batch's tokens are stamped when they come back, not at the end of the step
        assert reqs["first_token_ns"].nunique() > 1


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "interleaved", "serve"])
def test_gpu_ring_protocol_on_cpu_matches(
    schedule: str, expected: list[list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU ring's protocol (headers on CPU groups of their own, every payload a second message on the process
    group, as NCCL carries it there) run over gloo: the same tokens; Poisson arrivals make rank 0 poll."""
    from ppscope.engine.testing import HOST_HEADERS_ENV

    monkeypatch.setenv(HOST_HEADERS_ENV, "1")
    chunks = 2 if schedule == "interleaved" else 1
    arriving = dataclasses.replace(REQUESTS, rate=50.0 if schedule == "serve" else 0.0)
    cfg = _config(tmp_path / "run", PipelineConfig(stages=3, schedule=schedule, chunks=chunks), arriving)
    run_dir = run(cfg)
    assert _outputs(run_dir) == expected
    spans = load_run(run_dir).spans
    recv = spans[spans["kind"] == SpanKind.RECV]  # every payload came as a message of its own
    assert len(recv) == len(spans[spans["kind"] == SpanKind.SEND]) and (recv["nbytes"] > 0).all()


def test_uneven_split_and_batched_serve_match(expected: list[list[int]], tmp_path: Path) -> None:
    cfg = _config(
        tmp_path / "run", PipelineConfig(stages=2, schedule="serve", split=(6, 2), max_inflight=1, max_batch=3)
    )
    run_dir = run(cfg)
    assert _outputs(run_dir) == expected
    meta = read_meta(run_dir)
    assert (meta.split, meta.split_source) == ([6, 2], "--split")


@pytest.mark.slow
@pytest.mark.parametrize("stages", [1, 2])
def test_serve_admits_a_request_as_soon_as_another_in_its_micro_batch_finishes(tmp_path: Path, stages: int) -> None:
    lines = [([5, 9, 2], 1), ([7, 1, 3, 3, 8], 6), ([4, 4], 3), ([11, 2, 6, 1], 2), ([3], 5)]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": ids, "max_new_tokens": n}) + "\n" for ids, n in lines))
    pipeline = PipelineConfig(stages=stages, schedule="serve", max_inflight=1, max_batch=2)
    cfg = _config(tmp_path / "run", pipeline, WorkloadConfig(prompts=prompts))
    run_dir = run(cfg)
    assert _outputs(run_dir) == reference_outputs(EngineConfig(workload=WorkloadConfig(prompts=prompts)))
    trace = load_run(run_dir)
    reqs = trace.requests.set_index("id")
    # request 0 finishes after its first token; request 2 takes its place while request 1 still decodes
    assert reqs.loc[2, "first_token_ns"] < reqs.loc[1, "finish_ns"]
    fwd = trace.spans[(trace.spans["kind"] == SpanKind.FORWARD) & (trace.spans["rank"] == 0)]
    # a prompt beside a decoding request's token, in the slot's later passes (its steps run on through every
    # request it takes, so a later prompt alone in a slot that emptied counts too: hence at least 2 mixed ones)
    joined = fwd[(fwd["phase"] == "prefill") & (fwd["step"] > 0)]
    assert (joined["tokens"] > 2).sum() >= 2, joined[["step", "tokens"]]


def test_interleaved_with_uneven_groups_and_split(expected: list[list[int]], tmp_path: Path) -> None:
    # 3 micro-batches on 2 ranks: the last group of Megatron's order is short; virtual stages get 3,1,2,2 layers
    pipeline = PipelineConfig(stages=2, schedule="interleaved", chunks=2, microbatches=3, split=(3, 1, 2, 2))
    cfg = _config(tmp_path / "run", pipeline)
    assert _outputs(run(cfg)) == expected


def test_every_receive_forward_and_send_is_an_nvtx_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank runs in this process, so a stand-in NVTX domain sees its ranges (the ring's own, send and
    payload transfer, are checked between two processes in test_engine_comm)."""
    import nvtx

    pushed: list[str] = []

    class Spy:
        def get_category_id(self, name: str) -> int:
            return 0

        def get_event_attributes(self, message: str, **kw: Any) -> str:
            return message

        def push_range(self, attr: str) -> None:
            pushed.append(attr)

        def pop_range(self) -> None:
            pass

        def mark(self, **kw: Any) -> None:
            pass

    monkeypatch.setattr(nvtx, "get_domain", lambda name: Spy())
    run(_config(tmp_path / "run", PipelineConfig(stages=1, schedule="serve")))
    kinds = {message.split()[1] for message in pushed}
    assert {"recv_wait", "embed", "forward", "head", "sample"} <= kinds, kinds
    assert pushed.count("s0 recv_wait") == 5 * 3 + 1  # every pass's tokens came back round the ring, then stop

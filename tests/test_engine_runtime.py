"""The launcher and the run command: failures, options, requests, sampling and the run directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from error_helpers import cli_error, raises_code

from ppscope.cli.main import main
from ppscope.engine.config import (
    BenchConfig,
    EngineConfig,
    ModelConfig,
    OutputConfig,
    PipelineConfig,
    RuntimeConfig,
    WorkloadConfig,
)
from ppscope.engine.launch import run
from ppscope.engine.reference import reference_outputs
from ppscope.engine.requests import poisson_arrivals_ns
from ppscope.engine.testing import FAIL_ENV
from ppscope.errors import EngineFailedError, ErrorCode, InvalidConfigError
from ppscope.trace.store import load_run, read_meta, read_requests

FAST = ModelConfig(name="synthetic", layers=2, layer_cost_ms=(0.0,))


def _fast(out: Path, pipeline: PipelineConfig, workload: WorkloadConfig, **sections: Any) -> EngineConfig:
    """The 2-layer synthetic model that sleeps 0 ms, writing to `out` without a progress bar."""
    output = OutputConfig(out=out, progress=False)
    return EngineConfig(pipeline=pipeline, workload=workload, **{"model": FAST, "output": output, **sections})


def test_failed_rank_is_named_and_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAIL_ENV, "1=3")
    cfg = _fast(tmp_path / "run", PipelineConfig(stages=2), WorkloadConfig(requests=4, max_new_tokens=4))
    with raises_code(EngineFailedError, ErrorCode.RANK_FAILED) as exc:
        run(cfg)
    assert exc.value.exit_code != 0 and str(exc.value).startswith("rank 1 ")  # the rank that failed
    meta = read_meta(tmp_path / "run")
    assert meta.status == "failed" and "rank 1" in meta.error
    trace = load_run(tmp_path / "run")  # what was recorded up to the failure still opens
    assert trace.meta.status == "failed"


def test_bad_split_fails_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    failed = cli_error(capsys, ["run", "--stages", "2", "--split", "3,3", "--out", str(out), "--no-progress"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS
    assert failed.err.count("\n") == 1 and "3,3" in failed.text
    assert not out.exists()
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        PipelineConfig(schedule="1f1b")
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        PipelineConfig(schedule="serve", chunks=2)
    import torch

    if not torch.cuda.is_available():
        with raises_code(InvalidConfigError, ErrorCode.NO_GPU):
            run(_fast(tmp_path / "nccl", PipelineConfig(), WorkloadConfig(), runtime=RuntimeConfig(backend="nccl")))
        assert not (tmp_path / "nccl").exists()


def test_run_command_json_and_no_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["run", "--stages", "1", "--model", "synthetic", "--layers", "2", "--layer-cost-ms", "0"]
    assert main([*args, "--requests", "3", "--no-record", "--json", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 3 and summary["tokens"] == 24 and summary["status"] == "finished"
    assert not list(out.glob("rank-*.sqlite"))  # nothing recorded
    assert main([*args, "--out", str(out), "--no-progress"]) == 2  # never overwrites a run
    meta = read_meta(out)
    assert meta.config["record"] is False and meta.config["max_inflight"] == 1
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 0  # latency only, said in one warning, no missing-file alarm
    report = capsys.readouterr()
    said = report.out + report.err
    assert "recorded with --no-record" in said and "recorded nothing" not in said and "record anything" not in said
    # with the progress bar on, it goes to stderr: stdout stays one JSON document (`| jq` works)
    assert main([*args, "--requests", "2", "--json", "--out", str(tmp_path / "bar")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["requests"] == 2 and "requests" in captured.err


@pytest.mark.slow
def test_prompts_file_with_uneven_lengths_in_one_batch(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt_ids": [1, 2, 3], "max_new_tokens": 4},
        {"prompt_ids": [7] * 9, "max_new_tokens": 2},
        {"prompt_ids": [5, 6], "max_new_tokens": 3},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=1, schedule="gpipe", microbatches=1),
        workload=WorkloadConfig(prompts=prompts),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    run_dir = run(cfg)
    finish_order = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert [r["id"] for r in finish_order] == [1, 2, 0]  # written as each finishes
    lines = sorted(finish_order, key=lambda r: r["id"])
    assert [r["output_ids"] for r in lines] == reference_outputs(cfg)
    assert [r["output_len"] for r in lines] == [4, 2, 3]
    assert set(lines[0]) >= {
        "id",
        "prompt_len",
        "output_len",
        "arrival_ns",
        "first_token_ns",
        "finish_ns",
        "prompt_ids",
        "output_ids",
    }


@pytest.mark.slow
def test_sampling_draws_per_request_whatever_the_schedule(tmp_path: Path) -> None:
    """A draw is keyed by (seed, request, position): the unsplit model's, every schedule's and stage count's
    tokens are the same, identical prompts get their own tokens, and another seed gives others."""
    prompts = tmp_path / "same.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7], "max_new_tokens": 6}\n' * 4)

    sampled = WorkloadConfig(prompts=prompts, temperature=1.0, top_p=0.9)

    def outputs(name: str, pipeline: PipelineConfig, workload: WorkloadConfig = sampled) -> list[list[int]]:
        output = OutputConfig(progress=False, out=tmp_path / name)
        cfg = EngineConfig(pipeline=pipeline, workload=workload, output=output)
        lines = [json.loads(line) for line in (run(cfg) / "requests.jsonl").read_text().splitlines()]
        return [r["output_ids"] for r in sorted(lines, key=lambda r: r["id"])]

    expected = reference_outputs(EngineConfig(workload=sampled))
    assert len({tuple(out) for out in expected}) == 4  # four requests, four draws
    assert outputs("serve-1", PipelineConfig(stages=1)) == expected  # one slot, refilled by each request in turn
    assert outputs("gpipe-2", PipelineConfig(schedule="gpipe", stages=2)) == expected
    arriving = dataclasses.replace(sampled, rate=200.0)
    assert outputs("serve-2", PipelineConfig(schedule="serve", stages=2, max_batch=2), arriving) == expected
    assert expected != reference_outputs(EngineConfig(workload=WorkloadConfig(prompts=prompts)))  # greedy
    assert expected != reference_outputs(EngineConfig(workload=dataclasses.replace(sampled, seed=1)))


@pytest.mark.slow
def test_waiting_for_sparse_arrivals_is_not_taken_for_a_hung_rank(tmp_path: Path) -> None:
    # seed 1 at 1 req/s: the first request arrives after 3.2 s, longer than the 2 s the other rank waits for
    # rank 0 (a timeout that also bounds start-up and every barrier, hence not shorter on a busy machine)
    cfg = _fast(
        tmp_path / "run",
        PipelineConfig(stages=2, schedule="serve"),
        WorkloadConfig(rate=1.0, requests=3, max_new_tokens=2, seed=1),
        runtime=RuntimeConfig(timeout_s=2.0),
    )
    assert poisson_arrivals_ns(3, 1.0, 1)[0] > 3e9
    trace = load_run(run(cfg))
    assert trace.meta.status == "finished" and len(trace.requests) == 3
    waits = trace.spans[trace.spans["kind"] == "recv_wait"]
    assert (waits["mb"] >= 0).all()  # the keep-alive messages are not recorded as waits for a micro-batch


def test_a_serve_pass_is_named_by_its_micro_batch_and_step_through_every_request(tmp_path: Path) -> None:
    # 6 requests of 2 tokens through 2 slots: each slot takes 3 requests one after another, 6 passes in all
    cfg = _fast(
        tmp_path / "run", PipelineConfig(stages=2, schedule="serve"), WorkloadConfig(requests=6, max_new_tokens=2)
    )
    spans = load_run(run(cfg)).spans
    forward = spans[spans["kind"] == "forward"]
    assert not forward.duplicated(["rank", "mb", "step"]).any()
    assert sorted(forward.groupby(["rank", "mb"])["step"].max()) == [5, 5, 5, 5]
    assert len(forward[forward["phase"] == "prefill"]) == 2 * 6  # a prompt on each stage for every request


def test_poisson_arrivals_are_spread_and_served_after_arrival(tmp_path: Path) -> None:
    cfg = _fast(
        tmp_path / "run",
        PipelineConfig(stages=1, schedule="serve"),
        WorkloadConfig(rate=200.0, requests=5, max_new_tokens=2),
    )
    reqs = read_requests(run(cfg)).sort_values("id")
    arrivals = reqs["arrival_ns"].to_numpy()
    assert (arrivals[1:] > arrivals[:-1]).all()
    assert (reqs["first_token_ns"] >= reqs["arrival_ns"]).all()


def test_every_token_is_timed_and_recording_can_alternate_within_a_run(tmp_path: Path) -> None:
    window_ms = 40.0
    cfg = _fast(
        tmp_path / "run",
        PipelineConfig(stages=2, schedule="serve"),
        WorkloadConfig(requests=4, max_new_tokens=30),
        model=dataclasses.replace(FAST, layer_cost_ms=(2.0,)),
        bench=BenchConfig(record_alternate_ms=window_ms),
    )
    run_dir = run(cfg)
    lines = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    for req in lines:
        times = req["token_ns"]
        assert len(times) == req["output_len"] == 30
        assert times == sorted(times) and times[0] == req["first_token_ns"] and times[-1] == req["finish_ns"]
    fwd = load_run(run_dir).spans
    fwd = fwd[fwd["kind"] == "forward"]
    window_ns = int(window_ms * 1e6)
    on = (fwd["start_ns"] // window_ns % 2 == 0) | ((fwd["start_ns"] - 10_000_000) // window_ns % 2 == 0)
    # ~240 forwards over ~0.3 s: both kinds of window are crossed, and only the "on" ones hold spans (a
    # forward is recorded if recording was on when its pass began, a moment before it starts: up to 10 ms of
    # a 40 ms window on a busy machine)
    assert 0 < len(fwd) < 2 * 4 * 30 and on.all()


def test_one_rank_stamps_each_micro_batch_s_tokens_when_they_are_sampled(tmp_path: Path) -> None:
    cfg = _fast(
        tmp_path / "run",
        PipelineConfig(stages=1, schedule="gpipe", microbatches=2),
        WorkloadConfig(requests=2, max_new_tokens=2),
        model=dataclasses.replace(FAST, layer_cost_ms=(10.0,)),
    )
    trace = load_run(run(cfg))
    sample = trace.spans[(trace.spans["kind"] == "sample") & (trace.spans["step"] == 0)].set_index("mb")["end_ns"]
    first = trace.requests.set_index("id")["first_token_ns"]  # request i is in micro-batch i
    # mb 0's token is in hand when it is sampled, not after mb 1's 20 ms pass
    assert sample[0] <= first[0] < sample[1] <= first[1]


def test_alternating_needs_recording_on() -> None:
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        EngineConfig(output=OutputConfig(record=False), bench=BenchConfig(record_alternate_ms=10.0))
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        BenchConfig(record_alternate_ms=-1.0)


def test_a_rank_freezes_its_start_up_heap_for_the_run_and_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    frozen_during: list[int] = []
    real_freeze = gc.freeze

    def freeze() -> None:
        real_freeze()
        frozen_during.append(gc.get_freeze_count())

    monkeypatch.setattr("ppscope.engine.worker.gc.freeze", freeze)
    before = gc.get_freeze_count()
    run(_fast(tmp_path / "run", PipelineConfig(stages=1), WorkloadConfig(requests=2, max_new_tokens=2)))
    assert len(frozen_during) == 1 and frozen_during[0] > before  # the full collector skips it during the run
    assert gc.get_freeze_count() == before  # a rank run in the caller's process leaves its heap as it was


def test_tokens_are_stamped_once_they_are_on_the_host() -> None:
    """On a GPU the host reads the token ids only when the device has produced them: the stamp comes after."""
    import time
    import types

    from ppscope.engine.comm import TOKENS, Message
    from ppscope.engine.requests import Request
    from ppscope.engine.schedules import Pipeline
    from ppscope.trace.recorder import Recorder

    class SlowIds:  # a device tensor whose copy to the host waits for the kernel that computes it
        def tolist(self) -> list[int]:
            time.sleep(0.05)
            return [7]

    rec = Recorder(None, rank=0, stage=0, nvtx=False)
    host = types.SimpleNamespace(rec=rec, on_finish=lambda r: None)
    req = Request(id=0, prompt_ids=[1], max_new_tokens=2)
    before = rec.now_ns()
    Pipeline._apply_tokens(host, [req], Message(TOKENS, 0, 0, 0, payload=SlowIds()))  # type: ignore[arg-type]
    assert req.output_ids == [7] and req.first_token_ns - before >= 50_000_000

"""The recording hook for torch.distributed.pipelining, in this process (one rank, gloo): every action a span,
the run directory ppscope reads, torch's functions given back when recording stops."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from error_helpers import raises_code

from ppscope.errors import ErrorCode

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch.distributed.pipelining import schedules  # noqa: E402

from ppscope.analysis import analyze  # noqa: E402
from ppscope.integrations.pipelining import record_pipeline  # noqa: E402
from ppscope.trace.store import load_run  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pipelining_train.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipelining_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pipelining_train"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train(
    example: ModuleType, schedule_name: str, run: Path, steps: int = 2, m: int = 4, *more: str, **options: object
) -> None:
    args = example.parse(
        ["--schedule", schedule_name, "--microbatches", str(m), "--layers", "4", "--dim", "16", "--seq", "8", *more]
    )
    schedule, _ = example.build(args, 0, 1, torch.device("cpu"))
    tokens = torch.randint(0, args.vocab, (m * args.mb_size, args.seq + 1))
    with record_pipeline(schedule, run, **options):
        for _ in range(steps):
            schedule.step(tokens[:, :-1], target=tokens[:, 1:], losses=[])


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("name", "stages", "types"), [("gpipe", 1, {"B"}), ("interleaved-1f1b", 2, {"B"})])
def test_each_action_is_a_span(example: ModuleType, tmp_path: Path, name: str, stages: int, types: set[str]) -> None:
    before = (schedules._batch_p2p, schedules._wait_batch_p2p)
    _train(example, name, tmp_path / "run")
    assert (schedules._batch_p2p, schedules._wait_batch_p2p) == before  # given back
    trace = load_run(tmp_path / "run")
    meta, spans = trace.meta, trace.spans
    assert (meta.source, meta.status, meta.microbatches, meta.chunks) == ("pipelining", "finished", 4, stages)
    assert meta.config["schedule_class"] in ("ScheduleGPipe", "ScheduleInterleaved1F1B")
    fwd = spans[spans["kind"] == "forward"]
    bwd = spans[spans["kind"] == "backward"]
    # each stage runs every micro-batch forward and backward in each of the 2 steps
    assert len(fwd) == len(bwd) == 2 * 4 * stages
    assert sorted(fwd["mb"].unique()) == [0, 1, 2, 3] and sorted(fwd["step"].unique()) == [0, 1]
    assert sorted(fwd["stage"].unique()) == list(range(stages)) == sorted(fwd["chunk"].unique())
    assert set(bwd["phase"]) == types and set(fwd["phase"]) == {"F"}
    assert (spans["kind"] == "head").sum() == 2 * 4  # the loss, on the last stage
    assert (spans["kind"] == "step").sum() == 2
    result = analyze(trace)
    assert result.stages[0].time_per_mb_ns is not None and result.bubble_ratio is not None


@pytest.mark.usefixtures("group")
def test_recording_needs_a_new_run_directory(example: ModuleType, tmp_path: Path) -> None:
    _train(example, "gpipe", tmp_path / "run", steps=1)
    from ppscope.errors import RunExistsError

    with pytest.raises(RunExistsError):
        _train(example, "gpipe", tmp_path / "run", steps=1)
    assert schedules._batch_p2p.__module__ == "torch.distributed.pipelining.schedules"


@pytest.mark.usefixtures("group")
def test_the_run_holds_each_virtual_stages_layers_and_rebalances(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ppscope.cli.main import main

    more = ["--layers", "8", "--chunks", "4", "--split", "5,1,1,1", "--dim", "32"]
    _train(example, "interleaved-1f1b", tmp_path / "run", 4, 4, *more)
    meta = load_run(tmp_path / "run").meta
    assert (meta.split, meta.split_source, meta.model, meta.chunks) == (
        [5, 1, 1, 1],
        "stage modules' layers",
        {"layers": 8},
        4,
    )
    assert main(["rebalance", str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["current_split"] == [5, 1, 1, 1] and out["proposed_split"][0] < 5  # layers off the slow stage
    assert out["training"]["virtual_stages"] and out["fit"]["phase"] == "forward+backward"
    assert out["megatron_layout"].startswith("--pipeline-model-parallel-layout 'Et*")


@pytest.mark.usefixtures("group")
def test_a_split_given_to_the_hook_is_recorded_and_checked(example: ModuleType, tmp_path: Path) -> None:
    from ppscope.errors import InvalidSplitError

    _train(example, "interleaved-1f1b", tmp_path / "run", 1, 4, split=(3, 1))
    meta = load_run(tmp_path / "run").meta
    assert (meta.split, meta.split_source, meta.model) == ([3, 1], "record_pipeline(split=)", {"layers": 4})
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_STAGE_COUNT):
        _train(example, "interleaved-1f1b", tmp_path / "bad", 1, 4, split=(2, 1, 1))


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("every", "sampled"), [(1, [0, 1, 2, 3]), (2, [0, 2])])
def test_layers_are_timed_forward_and_backward_in_sampled_micro_batches(
    example: ModuleType, tmp_path: Path, every: int, sampled: list[int]
) -> None:
    from ppscope.balance.measured.insitu import insitu_costs
    from ppscope.errors import UnsupportedInputError
    from ppscope.trace.layers import layer_indices

    _train(example, "gpipe", tmp_path / "run", layer_spans=every)
    trace = load_run(tmp_path / "run")
    spans = trace.spans
    laid = spans[spans["kind"] == "layer"]
    # 4 layers, forward and backward, in the sampled micro-batches of both steps
    assert len(laid) == 4 * 2 * len(sampled) * 2 and sorted(laid["mb"].unique()) == sampled
    assert sorted(layer_indices(laid["name"]).unique()) == [0, 1, 2, 3] and set(laid["phase"]) == {"F", "B"}
    for phase, kind in (("F", "forward"), ("B", "backward")):
        actions = spans[spans["kind"] == kind]
        for row in laid[laid["phase"] == phase].itertuples():  # inside the action of its micro-batch and step
            mine = actions[(actions["mb"] == row.mb) & (actions["step"] == row.step)]
            assert ((mine["start_ns"] <= row.start_ns) & (row.end_ns <= mine["end_ns"])).any()
    if every > 1:  # 4 sampled micro-batches per layer: too few to trust a median
        with raises_code(UnsupportedInputError, ErrorCode.TOO_FEW_SAMPLES):
            insitu_costs([trace])
        return
    got = insitu_costs([trace])
    assert got.phase == "forward+backward" and got.passes == (2 * len(sampled),) * 4
    fwd = laid[(laid["phase"] == "F") & (laid["name"] == "layer 2")]
    bwd = laid[(laid["phase"] == "B") & (laid["name"] == "layer 2")]
    expected = ((fwd["end_ns"] - fwd["start_ns"]).median() + (bwd["end_ns"] - bwd["start_ns"]).median()) / 1e6
    assert got.costs.layer_ms[2] == pytest.approx(expected)


@pytest.mark.usefixtures("group")
def test_no_layer_spans_when_asked_for_none(example: ModuleType, tmp_path: Path) -> None:
    _train(example, "gpipe", tmp_path / "run", layer_spans=0)
    assert not (load_run(tmp_path / "run").spans["kind"] == "layer").any()

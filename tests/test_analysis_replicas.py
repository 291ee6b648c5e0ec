"""Many pipelines: data-parallel replicas analysed each on its own, and compared stage by stage."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from error_helpers import cli_error, raises_code
from replica_helpers import replica_job

from ppscope.analysis import analyze
from ppscope.analysis.placement import apply_placement, parse_stage_of_rank, placement_of
from ppscope.analysis.replica_report import replica_lines
from ppscope.analysis.replicas import analyze_replicas, rank_list
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import write_run
from ppscope.simulate.whatif import what_if
from ppscope.trace.notices import NoticeCode


def test_the_slowed_replica_is_named_with_its_ratio_to_the_median() -> None:
    # 4 stages x 6 replicas, stage-major ranks (stage * 6 + replica); stage 2 of replica 4 runs 1.3x slower,
    # stage 0 of replica 1 1.1x slower
    trace = replica_job(4, 6, slow={(2, 4): 1.3, (0, 1): 1.1})
    placement = placement_of(trace)
    assert placement is not None and placement.replicas == list(range(6)) and placement.stages == [0, 1, 2, 3]
    ra = analyze_replicas(trace, placement)
    assert ra.bottleneck == (2, 4, 2 * 6 + 4)
    assert ra.bottleneck_slowdown == pytest.approx(1.3)
    by_stage = {s.stage: s for s in ra.stages}
    assert by_stage[2].straggler_replica == 4 and by_stage[2].slowdown == pytest.approx(1.3)
    assert by_stage[2].median_ns == pytest.approx(2e6) and by_stage[2].slowest_ns == pytest.approx(2.6e6)
    assert by_stage[0].straggler_rank == 1 and by_stage[0].slowdown == pytest.approx(1.1)
    assert by_stage[1].slowdown == pytest.approx(1.0) and by_stage[3].slowdown == pytest.approx(1.0)
    # each replica is a pipeline of its own: the equal ones have GPipe's bubble, (P-1)/(M+P-1) = 3/11
    ratios = {r.replica: r.bubble_ratio for r in ra.replicas}
    assert ratios[0] == pytest.approx(3 / 11) and ra.bubble_median == pytest.approx(3 / 11)
    assert ra.bubble_worst_replica == 4 and ratios[4] > ratios[1] > ratios[0]
    assert ra.shown_replica == 4 and not ra.missing_ranks and not ra.incomplete_replicas
    text = "\n".join(replica_lines(ra))
    assert "bottleneck: stage 2, replica 4, rank 16" in text and "+30.0% over the stage's median" in text
    assert text.count("\n2 ") == 1  # one row per stage, not per replica


def test_a_replica_is_not_merged_into_one_stage_with_the_others() -> None:
    """Without the replica, ranks of one stage are one stage (tensor parallel): the slow replica vanishes
    into the union of the others' compute. With it, every replica has its own P stages."""
    trace = replica_job(3, 4, slow={(1, 2): 1.5})
    merged = analyze(dataclasses.replace(trace, meta=_without_replicas(trace.meta)))
    assert merged.pp_size == 3 and merged.stage(1).ranks == [4, 5, 6, 7]
    ra = analyze_replicas(trace, placement_of(trace))  # type: ignore[arg-type]
    assert [len(res.stages) for res in ra.results.values()] == [3, 3, 3, 3]
    assert ra.bottleneck == (1, 2, 6) and ra.bottleneck_slowdown == pytest.approx(1.5)


def _without_replicas(meta):  # type: ignore[no-untyped-def]
    return dataclasses.replace(meta, ranks=[dataclasses.replace(i, replica=-1) for i in meta.ranks])


def test_stage_of_rank_places_a_replica_major_job() -> None:
    trace = replica_job(4, 3, slow={(3, 1): 1.2}, stage_major=False, say_replica=False)
    assert placement_of(trace) is None  # the metadata says nothing of replicas: one pipeline, as before
    placement = placement_of(trace, parse_stage_of_rank("rank%4"))
    assert placement is not None and placement.place[7] == (3, 1) and placement.ranks_of(2) == [8, 9, 10, 11]
    ra = analyze_replicas(apply_placement(trace, placement), placement)
    assert ra.bottleneck == (3, 1, 7) and ra.bottleneck_slowdown == pytest.approx(1.2)
    assert NoticeCode.CROSSING_REPLICAS not in {w.code for w in ra.warnings}
    wrong = placement_of(trace, parse_stage_of_rank("rank//3"))  # stage-major read of a replica-major job
    assert wrong is not None
    warned = analyze_replicas(apply_placement(trace, wrong), wrong).warnings
    assert NoticeCode.CROSSING_REPLICAS in {w.code for w in warned}


def test_tensor_parallel_ranks_of_one_replica_form_one_stage() -> None:
    # ranks 0-7: stage 0, 8-15: stage 1; --tp 2: (0, 1) are replica 0's stage 0, (2, 3) replica 1's, ...
    trace = replica_job(2, 8, stage_major=True, say_replica=False)
    placement = placement_of(trace, parse_stage_of_rank("0-7:0,8-15:1"), tp=2)
    assert placement is not None and placement.replicas == [0, 1, 2, 3]
    assert placement.place[3] == (0, 1) and placement.place[14] == (1, 3)
    ra = analyze_replicas(apply_placement(trace, placement), placement)
    assert [s.ranks for s in ra.results[1].stages] == [[2, 3], [10, 11]]


@pytest.mark.parametrize(
    ("spec", "names"),
    [  # what the message names: the rule, the rank given two stages, the range
        ("rank//0", ("'rank//0'",)),
        ("rank*2", ("'rank*2'",)),
        ("0-3:0,3-5:1", ("rank 3", "(0, 1)")),
        ("5-2:0", ("'5-2:0'",)),
        ("zero:1", ("'zero:1'",)),
        (",", ("--stage-of-rank",)),
    ],
)
def test_stage_of_rank_errors_are_one_line(spec: str, names: tuple[str, ...]) -> None:
    with raises_code(InvalidConfigError, ErrorCode.BAD_PLACEMENT) as err:
        parse_stage_of_rank(spec)
    assert all(name in str(err.value) for name in names) and "\n" not in str(err.value)


def test_stage_of_rank_rules() -> None:
    assert [parse_stage_of_rank("rank//4").stage(r) for r in (0, 3, 4, 9)] == [0, 0, 1, 2]
    assert [parse_stage_of_rank("rank%4").stage(r) for r in (0, 3, 4, 9)] == [0, 3, 0, 1]
    assert [parse_stage_of_rank("rank // 2 % 4").stage(r) for r in (0, 1, 2, 7, 8)] == [0, 0, 1, 3, 0]
    assert [parse_stage_of_rank("0-1:1,2:0").stage(r) for r in (0, 1, 2, 3)] == [1, 1, 0, None]


def test_tp_that_does_not_divide_a_stage_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(replica_job(2, 3, say_replica=False), tmp_path / "job")
    failed = cli_error(capsys, ["analyze", str(run), "--stage-of-rank", "rank//3", "--tp", "2"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.BAD_PLACEMENT and failed.err.count("\n") == 1
    assert "stage 0" in failed.text and "--tp 2" in failed.text  # the stage, and the degree it does not divide
    failed = cli_error(capsys, ["analyze", str(run), "--tp", "2"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.CONFLICTING_OPTIONS and "--stage-of-rank" in failed.text


def test_one_replica_is_analysed_exactly_as_today(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = write_run(replica_job(4, 1, slow={(2, 0): 1.2}, say_replica=False), tmp_path / "plain")
    said = write_run(replica_job(4, 1, slow={(2, 0): 1.2}, say_replica=True), tmp_path / "said")
    result = analyze(open_trace(plain))
    result.what_if_reason = what_if(open_trace(plain))[1]  # an inference run: no training step, and why
    expected = result.to_json()
    assert expected["what_if_reason"]["code"] == "no_training_step"
    outputs = []
    for run, extra in ((plain, []), (said, []), (plain, ["--stage-of-rank", "rank//1"])):
        assert main(["analyze", str(run), "--json", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert all(out == expected for out in outputs)
    assert main(["analyze", str(plain)]) == 0
    assert "data-parallel" not in capsys.readouterr().out


def test_missing_and_damaged_rank_files_name_their_replicas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(replica_job(4, 8, slow={(1, 5): 1.3}), tmp_path / "job")
    (run / "rank-00002.sqlite").unlink()  # stage 0 of replica 2
    (run / "rank-00027.sqlite").write_bytes(b"not a database" * 100)  # stage 3 of replica 3
    trace = open_trace(run)
    ra = analyze_replicas(trace, placement_of(trace))  # type: ignore[arg-type]
    assert ra.missing_ranks == [2, 27] and ra.incomplete_replicas == [2, 3]
    assert ra.bottleneck == (1, 5, 13)  # the rest still analyse
    assert ra.results[2].missing is not None and len(ra.results[2].stages) == 3
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert "missing: ranks 2, 27 of 32 recorded nothing" in out and "incomplete replica(s): 2-3" in out
    assert "rank 27's file is damaged" in out and "rank-00027.sqlite" in out
    assert main(["analyze", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["replicas"]["missing_ranks"] == [2, 27] and doc["replicas"]["incomplete_replicas"] == [2, 3]
    assert doc["replicas"]["bottleneck"] == {"stage": 1, "replica": 5, "rank": 13}
    assert doc["stages"][1]["ranks"] == [13] and doc["bubble_ratio"] is not None  # the bottleneck's pipeline


def test_rank_list_is_compact() -> None:
    assert rank_list([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    assert rank_list(list(range(0, 100, 2)), most=3) == "0, 2, 4, ... (50 in all)"


def test_a_replica_that_is_not_an_integer_is_refused_by_name() -> None:
    from ppscope.errors import CorruptFileError
    from ppscope.trace.model import RunMeta

    with raises_code(CorruptFileError, ErrorCode.BAD_METADATA):
        RunMeta.from_dict({"ranks": [{"rank": 0, "stage": 0, "replica": "a"}]}, where="meta.json")
    meta = RunMeta.from_dict({"ranks": [{"rank": 3, "stage": 1, "replica": 2}]})
    assert meta.ranks[0].replica == 2 and RunMeta.from_dict({"ranks": [{"rank": 0}]}).ranks[0].replica == -1

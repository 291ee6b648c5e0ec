"""Kineto files of a job of data-parallel pipelines: `distributedInfo`'s process groups place every rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppscope.analysis.placement import placement_of
from ppscope.analysis.replicas import analyze_replicas
from ppscope.cli.main import main
from ppscope.formats.sources import open_trace


def _mesh(pp: int, dp: int, tp: int) -> dict[str, list[list[int]]]:
    """DeviceMesh(("pp", "dp", "tp")) groups: rank = (s * dp + d) * tp + t, as torch numbers a mesh."""

    def rank(s: int, d: int, t: int) -> int:
        return (s * dp + d) * tp + t

    return {
        "pp": [[rank(s, d, t) for s in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[rank(s, d, t) for d in range(dp)] for s in range(pp) for t in range(tp)],
        "tp": [[rank(s, d, t) for t in range(tp)] for s in range(pp) for d in range(dp)],
    }


def _doc(rank: int, world: int, groups: dict[str, list[list[int]]], kernel_us: float) -> dict:
    pg = [
        {
            "pg_name": "0",
            "pg_desc": "default_pg",
            "backend_config": "cuda:nccl",
            "pg_size": world,
            "ranks": list(range(world)),
        }
    ]
    for dim, members in groups.items():
        mine = next(g for g in members if rank in g)
        if len(mine) > 1:  # torch creates no group of one for a mesh dimension of size 1 here either
            pg.append(
                {
                    "pg_name": str(len(pg)),
                    "pg_desc": f"mesh_{dim}",
                    "backend_config": "cuda:nccl",
                    "pg_size": len(mine),
                    "ranks": mine,
                }
            )
    events: list[dict] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 2000}
    ]
    for i in range(4):  # four compute kernels, then a send to the next stage
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sm90_gemm",
                "pid": 0,
                "tid": 7,
                "ts": 100 + 400 * i,
                "dur": kernel_us,
                "args": {"stream": 7},
            }
        )
    info = {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(pg), "pg_config": pg}
    return {"schemaVersion": 1, "traceEvents": events, "distributedInfo": info, "baseTimeNanoseconds": 10**15}


def _job(folder: Path, pp: int, dp: int, tp: int, slow: dict[int, float]) -> Path:
    folder.mkdir()
    groups = _mesh(pp, dp, tp)
    world = pp * dp * tp
    for r in range(world):
        doc = _doc(r, world, groups, 100.0 * slow.get(r, 1.0))
        (folder / f"rank{r}.pt.trace.json").write_text(json.dumps(doc))
    return folder


def test_process_groups_map_ranks_to_stages_and_replicas(tmp_path: Path) -> None:
    # PP 2 x DP 3: pipeline groups (0, 3), (1, 4), (2, 5); rank 4 (stage 1 of replica 1) is 1.5x slower
    trace = open_trace(_job(tmp_path / "job", 2, 3, 1, slow={4: 1.5}))
    place = {i.rank: (i.stage, i.replica) for i in trace.meta.ranks}
    assert place == {0: (0, 0), 1: (0, 1), 2: (0, 2), 3: (1, 0), 4: (1, 1), 5: (1, 2)}
    assert trace.meta.pp_size == 2 and "pipeline process group" in trace.meta.config["replica_placement"]
    placement = placement_of(trace)
    assert placement is not None and placement.source == trace.meta.config["replica_placement"]
    ra = analyze_replicas(trace, placement)
    assert ra.basis == "busy" and ra.bottleneck == (1, 1, 4) and ra.bottleneck_slowdown == pytest.approx(1.5)


def test_tensor_parallel_groups_join_ranks_into_one_stage(tmp_path: Path) -> None:
    # PP 2 x DP 2 x TP 2: ranks 0, 1 are stage 0 of replica 0; 2, 3 stage 0 of replica 1; 4-7 stage 1
    trace = open_trace(_job(tmp_path / "job", 2, 2, 2, slow={7: 1.2}))
    place = {i.rank: (i.stage, i.replica) for i in trace.meta.ranks}
    assert place == {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1), 4: (1, 0), 5: (1, 0), 6: (1, 1), 7: (1, 1)}
    ra = analyze_replicas(trace, placement_of(trace))  # type: ignore[arg-type]
    assert [s.ranks for s in ra.results[1].stages] == [[2, 3], [6, 7]]
    assert ra.bottleneck == (1, 1, 7)  # of the stage's two ranks, the busier one


def test_a_damaged_file_is_named_and_its_replica_incomplete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _job(tmp_path / "job", 2, 3, 1, slow={4: 1.5})
    path = folder / "rank2.pt.trace.json"
    path.write_text(path.read_text()[:300])  # cut short
    assert main(["analyze", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "missing: rank 2 of 6 recorded nothing" in out and "incomplete replica(s): 2" in out
    assert "left out a damaged file" in out and "rank2.pt.trace.json" in out
    assert "bottleneck: stage 1, replica 1, rank 4" in out


def test_files_without_process_groups_are_one_pipeline_as_before(tmp_path: Path) -> None:
    folder = _job(tmp_path / "job", 2, 1, 1, slow={})
    for path in folder.iterdir():
        doc = json.loads(path.read_text())
        del doc["distributedInfo"]["pg_config"]
        path.write_text(json.dumps(doc))
    trace = open_trace(folder)
    assert placement_of(trace) is None and all(i.replica == -1 for i in trace.meta.ranks)
    assert "replica_placement" not in trace.meta.config and trace.meta.world_size == 2

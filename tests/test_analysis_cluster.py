"""`analyze_run(..., ray=...)`: the per-rank work as tasks of a Ray cluster (a local instance of 2 CPUs here)
gives the result of `--workers 1`; a worker that dies is retried once, then named; errors stay ppscope's."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.analysis.sharded import analyze_run
from ppscope.errors import ErrorCode, InvalidConfigError, WorkerFailedError
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import rank_file

sys.path.insert(0, str(Path(__file__).parent))
from test_analysis_sharded import RUNS, _same, _sim

ray = pytest.importorskip("ray", reason="Ray is the optional extra ppscope[cluster]")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("name", ["gpipe", "serve"])
def test_ray_tasks_give_the_result_of_one_worker(name: str, cluster: None, tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS[name])
    _same(analyze_run(run, workers=1), analyze_run(run, ray="local"))


def test_a_worker_that_dies_is_retried_once_then_named(cluster: None, tmp_path: Path) -> None:
    from ppscope.analysis.cluster import RayPool

    marker = tmp_path / "tries"

    def die(files: object) -> None:
        with open(marker, "a") as f:
            f.write("x")
        os._exit(1)

    with RayPool("local") as pool, raises_code(WorkerFailedError, ErrorCode.WORKER_DIED) as err:
        pool.submit(die, {3: tmp_path / "rank-00003.sqlite"}).result()  # a task's files say what it read
    assert "rank(s) 3" in str(err.value)
    assert marker.read_text() == "xx"  # the first try and its one retry


def test_a_damaged_rank_file_is_left_out_and_named_as_without_ray(cluster: None, tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS["gpipe"])
    rank_file(run, 1).write_bytes(b"not a database at all" * 100)
    remote = analyze_run(run, ray="local")
    _same(analyze_run(run), remote)
    (damaged,) = [n.text for n in remote.warnings if n.code == NoticeCode.DAMAGED_FILE]
    assert "rank 1" in damaged and "rank-00001.sqlite" in damaged  # names it


def test_the_command_with_ray(cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ppscope.cli.main import main

    run = _sim(tmp_path, **RUNS["interleaved"])
    assert main(["analyze", str(run), "--json", "--workers", "1"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(run), "--json", "--ray", "local"]) == 0
    assert json.loads(capsys.readouterr().out) == local


def test_ray_not_installed_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as when it is not installed
    with raises_code(InvalidConfigError, ErrorCode.NOT_INSTALLED):
        analyze_run(_sim(tmp_path, **RUNS["one-stage"]), ray="local")

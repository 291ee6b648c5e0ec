"""The engine as torchrun starts it (the README's command for many GPUs and nodes), on CPU with gloo: one
`ppscope run` process per rank, rank 0 writing the run, torchrun supervising."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ppscope.analysis import analyze
from ppscope.errors import ErrorCode
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import REQUESTS_FILE, load_run, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

INJECTED = "RuntimeError: injected failure after 1 passes"
"""What a rank told to fail (`PPSCOPE_TEST_FAIL`) raises: the error its failure must quote."""
RUN = [
    "--model",
    "synthetic",
    "--layers",
    "3",
    "--layer-cost-ms",
    "1",
    "--requests",
    "3",
    "--max-new-tokens",
    "4",
    "--no-progress",
    "--timeout",
    "30",
]


def _torchrun(ranks: int, out: Path, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "ppscope",
        "run",
        "--stages",
        str(ranks),
        *RUN,
        *options,
        "--out",
        str(out),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ | env)


def _outputs(run: Path) -> dict[int, list[int]]:
    lines = (run / REQUESTS_FILE).read_text().splitlines()
    return {r["id"]: r["output_ids"] for r in map(json.loads, lines)}


def test_a_run_under_torchrun_is_the_run_the_launcher_makes(tmp_path: Path) -> None:
    done = _torchrun(2, tmp_path / "tr")
    assert done.returncode == 0, done.stderr
    meta = read_meta(tmp_path / "tr")
    assert (meta.status, meta.world_size, [r.rank for r in meta.ranks]) == ("finished", 2, [0, 1])
    trace = load_run(tmp_path / "tr")
    assert set(trace.spans["rank"].unique()) == {0, 1} and not trace.warnings
    local = subprocess.run(
        [sys.executable, "-m", "ppscope", "run", "--stages", "1", *RUN, "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode == 0, local.stderr
    assert _outputs(tmp_path / "tr") == _outputs(tmp_path / "one") and len(_outputs(tmp_path / "one")) == 3


def test_the_rank_that_failed_under_torchrun_is_named_by_the_analysis(tmp_path: Path) -> None:
    """Torchrun stops the other ranks with SIGTERM when rank 1 fails, so rank 0 marks the run interrupted; the
    cause is what rank 1 recorded in its own file."""
    done = _torchrun(3, tmp_path / "tr", "--json", PPSCOPE_TEST_FAIL="1=1")
    assert done.returncode != 0
    # each rank prints its own error: the one that failed in its own code, and those stopped or whose link broke
    errors = [json.loads(line)["error"] for line in done.stdout.splitlines() if line.startswith('{"error"')]
    own = [e["text"] for e in errors if e["code"] == ErrorCode.RANK_FAILED]
    assert len(own) == 1 and own[0].startswith("rank 1 ") and INJECTED in own[0], done.stderr
    # each says where the trace is and how to read it; one whose link broke under it (when torchrun's SIGTERM
    # did not stop it first) is told from the cause by its code: most likely an echo
    assert all(str(tmp_path / "tr") in e["text"] and "ppscope analyze" in e["text"] for e in errors), errors
    codes = {e["code"] for e in errors}
    assert codes <= {ErrorCode.RANK_FAILED, ErrorCode.RANK_LOST_PEER, ErrorCode.INTERRUPTED}, errors
    meta = read_meta(tmp_path / "tr")
    assert meta.status in ("interrupted", "failed"), meta
    result = analyze(load_run(tmp_path / "tr"))
    failed = [n.text for n in result.warnings if n.code == NoticeCode.RANK_FAILED]
    assert any(text.startswith("rank 1 ") and INJECTED in text for text in failed), result.warnings

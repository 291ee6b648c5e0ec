"""The launcher when a run goes wrong early: Ctrl-C while the ranks start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.launch import _interrupt_deferred
from ppscope.store import read_meta

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("after_s", [0.0, 0.4])
def test_ctrl_c_while_the_ranks_start_is_one_line_and_marks_the_run(tmp_path: Path, after_s: float) -> None:
    """Ctrl-C from a terminal (SIGINT to the whole process group) once the run directory exists, while the fork
    server imports the engine and the ranks start: one line, exit 130, and the run is marked interrupted."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ppscope", "run", "--stages", "2", "--requests", "50", "--max-new-tokens", "50",
           "--no-progress", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "meta.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"ppscope run: error: interrupted; what was recorded up to then is in {out}"], (
        err
    )
    meta = read_meta(out)
    assert meta.status == "interrupted" and meta.error == "interrupted by the user"


def test_ctrl_c_is_held_until_the_end_of_a_deferred_block() -> None:
    with pytest.raises(KeyboardInterrupt), _interrupt_deferred():
        signal.raise_signal(signal.SIGINT)
        reached = True
    assert reached
    with _interrupt_deferred(drop=True):
        signal.raise_signal(signal.SIGINT)

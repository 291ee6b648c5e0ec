"""Run a script as 2 ranks under torchrun on this machine (CPU, gloo, one thread a rank), as the pipelining
benchmarks do: this checkout's ppscope on the path, stdout and stderr captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 script args...`; the caller checks it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)

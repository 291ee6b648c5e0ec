"""Snapshot the JSON that `analyze`, `rebalance` and `simulate` print for every trace the project tests against,
and compare two snapshots: a refactor shows, with it, that no figure moved.

    python scripts/json_snapshot.py take DIR        # one JSON file per case, written into DIR (must be new)
    python scripts/json_snapshot.py compare OLD NEW  # exit 0 when every case gives the same JSON

The cases: the real third-party traces in `../shared/data/` (skipped where that folder is absent), the real
torch.distributed.pipelining captures in `tests/data/pipelining/` and `tests/data/pipelining-nosteps/`, the
DeepSpeed pipeline capture in `tests/data/deepspeed-pipeline/`, and runs the simulator writes (deterministic,
so the same on every machine). Paths are compared from the checkout's `tests/data` or `shared/data` on, so
two checkouts compare. A warning is compared by its text alone: a warning that gained a code, or
moved from a plain string to `{"code", "text"}`, compares equal; a reworded one does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CAPTURES = ROOT / "tests" / "data" / "pipelining"
NOSTEPS = ROOT / "tests" / "data" / "pipelining-nosteps"
DEEPSPEED = ROOT / "tests" / "data" / "deepspeed-pipeline"

SIMULATED = {
    "sim_gpipe": [
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--layers",
        "32",
        "--layer-cost-ms",
        "1",
        "--split",
        "10,8,8,6",
    ],
    "sim_interleaved": [
        "--schedule",
        "interleaved",
        "--stages",
        "2",
        "--chunks",
        "2",
        "--microbatches",
        "4",
        "--layers",
        "16",
        "--layer-cost-ms",
        "0.5",
        "--split",
        "5,4,4,3",
    ],
    "sim_serve": [
        "--schedule",
        "serve",
        "--stages",
        "3",
        "--microbatches",
        "3",
        "--steps",
        "4",
        "--layers",
        "24",
        "--layer-cost-ms",
        "0.3",
        "--split",
        "9,8,7",
        "--comm-latency-us",
        "50",
    ],
}
MODEL_ADVICE = {
    "model_llama3_70b": ["--model", "llama3-70b", "--stages", "4", "--gpu", "h100-sxm"],
    "model_deepseek_v3": ["--model", "deepseek-v3", "--stages", "4", "--gpu", "h100-sxm"],
    "model_qwen_config": [
        "--model",
        str(ROOT / "tests/data/configs/qwen2.5-72b.json"),
        "--stages",
        "3",
        "--gpu",
        "a100-80gb",
    ],
}


def _ppscope(argv: list[str], cwd: Path) -> dict[str, Any]:
    # this checkout's ppscope, whichever one the interpreter's environment has installed: a snapshot of another
    # checkout (a worktree at an older commit) must run that checkout's code
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "ppscope", *argv], cwd=cwd, capture_output=True, text=True, env=env)
    out: dict[str, Any] = {"argv": argv, "exit": done.returncode}
    try:
        out["json"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        out["stdout"] = done.stdout
    out["stderr"] = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    return out


def _traces() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name in ("mfu_2gpu_after.sqlite", "mock.sqlite"):
        if (SHARED / "nsys" / name).exists():
            found["nsys_" + name.split(".")[0]] = SHARED / "nsys" / name
    if (SHARED / "kineto" / "trace_filter").is_dir():
        found["kineto_trace_filter"] = SHARED / "kineto" / "trace_filter"
    for job in sorted(p for p in CAPTURES.glob("*") if p.is_dir()):
        found["pipelining_" + job.name] = job
    for job in sorted(p for p in NOSTEPS.glob("*") if p.is_dir()):
        found["pipelining_nosteps_" + job.name] = job
    if DEEPSPEED.is_dir():
        found["deepspeed_pipeline"] = DEEPSPEED
    return found


def _split_of(name: str) -> list[str]:
    """The captures' split, which a Kineto trace does not record: 4 layers on 2 ranks, one or two stages each;
    DeepSpeed's capture: 3 blocks (and the embedding) on stage 0, 1 (and the head) on stage 1."""
    if name == "deepspeed_pipeline":
        return ["--current-split", "3,1"]
    if not name.startswith("pipelining_"):
        return []
    return ["--current-split", "2,2" if name.endswith(("gpipe", "1f1b")) and "interleaved" not in name else "1,1,1,1"]


def take(out: Path) -> None:
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases: dict[str, dict[str, Any]] = {}
        for name, argv in SIMULATED.items():
            cases[f"simulate_{name}"] = _ppscope(["simulate", *argv, "--out", name, "--json"], work)
            cases[f"simulate_{name}_replay"] = _ppscope(
                ["simulate", "--from", name, "--out", f"{name}_r", "--json"], work
            )
        traces = {name: Path(name) for name in SIMULATED} | _traces()
        for name, path in traces.items():
            cases[f"analyze_{name}"] = _ppscope(["analyze", str(path), "--json"], work)
            cases[f"rebalance_{name}"] = _ppscope(["rebalance", str(path), *_split_of(name), "--json"], work)
        for name, argv in MODEL_ADVICE.items():
            cases[f"rebalance_{name}"] = _ppscope(["rebalance", *argv, "--json"], work)
        for name in ("kineto_trace_filter", "nsys_mfu_2gpu_after"):
            if name in traces:
                argv = ["rebalance", str(traces[name]), "--model", "llama3-8b", "--json"]
                cases[f"rebalance_{name}_with_model"] = _ppscope(argv, work)
    for name, case in cases.items():
        (out / f"{name}.json").write_text(json.dumps(case, indent=1, sort_keys=True, default=str) + "\n")
    print(f"{len(cases)} cases written to {out}")


def _plain(value: Any, key: str = "") -> Any:
    """The value with every warning (and `missing`, a warning of its own) reduced to its text, so that a code
    added beside it compares equal."""
    if isinstance(value, dict):
        if set(value) >= {"code", "text"} and ("warning" in key or key == "missing"):
            return value["text"]
        return {k: _plain(v, k) for k, v in value.items() if not (k == "code" and "warning" in key)}
    if isinstance(value, list):
        return [_plain(v, key) for v in value]
    if isinstance(value, str):  # a checkout's own path: the same inputs wherever it lies
        return _CHECKOUT.sub(r"\1", value)
    return value


_CHECKOUT = re.compile(r"/\S*?/((?:tests|shared)/data/)")


def compare(old: Path, new: Path) -> int:
    names = sorted({p.name for p in old.glob("*.json")} | {p.name for p in new.glob("*.json")})
    differ = []
    for name in names:
        a, b = old / name, new / name
        if not (a.exists() and b.exists()):
            differ.append(f"{name}: only in {'the old' if a.exists() else 'the new'} snapshot")
        elif _plain(json.loads(a.read_text())) != _plain(json.loads(b.read_text())):
            differ.append(f"{name}: differs (diff the two files)")
    for line in differ:
        print(line)
    print(f"{len(names) - len(differ)} of {len(names)} cases give the same JSON")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("take").add_argument("dir", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.cmd == "take":
        take(args.dir)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())

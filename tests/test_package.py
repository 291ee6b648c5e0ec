"""The distribution: one top-level package, `ppscope`, with every part inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ppscope

ROOT = Path(__file__).resolve().parents[1]


def test_dir_lists_the_lazy_names() -> None:
    names = dir(ppscope)
    assert {"Recorder", "load_run", "RunTail", "Trace", "__version__"} <= set(names)
    assert ppscope.load_run.__module__ == "ppscope.trace.store"


@pytest.mark.slow
def test_the_wheel_installs_ppscope_alone(tmp_path: Path) -> None:
    """`pip install .` puts one name into site-packages: a user's own `engine` or `dashboard` stays theirs."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0 and "No module named" in out.stderr:
        pytest.skip(f"cannot build a wheel here: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("ppscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"ppscope"}, tops
    top_level = [n for n in names if n.endswith("top_level.txt")]
    if top_level:
        assert zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["ppscope"]
    for part in ("engine/worker.py", "dashboard/app.py", "trace/store.py", "balance/rebalance.py"):
        assert f"ppscope/{part}" in names


def test_engine_and_dashboard_are_not_top_level_names() -> None:
    """Run away from the checkout, so only what is installed can be imported."""
    code = "import importlib.util as u; print(u.find_spec('engine'), u.find_spec('dashboard'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None"]


def test_no_import_cycles() -> None:
    """Every import counts, in a function or under TYPE_CHECKING too: a part reads only parts below it."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("ppscope")
    cycles = [
        (m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m) if graph.chain_exists(i, m)
    ]
    assert not cycles, f"import cycles through: {sorted(cycles)[:5]}"


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "ppscope").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"split these by responsibility: {long}"

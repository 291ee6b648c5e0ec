"""The distribution: one top-level package, `ppscope`, with every part inside it."""

from __future__ import annotations

import ast
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
    for part in ("engine/worker.py", "dashboard/app.py", "trace/store.py", "balance/advise/rebalance.py"):
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


LONG_FUNCTIONS = {
    "ppscope/analysis/bubbles.py::_one_stage": "one stage's busy time, bubble and every cause in one pass over "
    "its idle intervals; the parts share the intervals' arrays",
    "ppscope/analysis/pipeline.py::hop_stats": "bytes, bandwidth and latency of every link from one pairing",
    "ppscope/balance/measured/fit.py::fit_layer_costs": "the least-squares system of every run's stages, built "
    "and solved in one place so that its rank and residuals are read off the same matrix",
    "ppscope/engine/tuning.py::tune": "the run, rebalance, re-run loop, its steps in the order they happen",
    "ppscope/engine/worker.py::_run_pipeline": "one rank's main: the process group, the stage, the schedule "
    "loop and the recorder's life, in the order a rank goes through them",
    "ppscope/formats/kineto/reader.py::load_kineto": "the job's files read in a pipeline of threads (inflate, "
    "decode) whose hand-offs are clearer in one function",
    "ppscope/simulate/simulator.py::simulate": "the discrete-event loop and the spans it writes",
    "ppscope/simulate/training.py::replay_training": "the replay's inputs measured from the trace, then its result",
    "ppscope/simulate/training.py::_as_trace": "every replayed action's span and wait, written as the simulator's",
    "ppscope/engine/comm.py::Ring._take": "the wait for a posted receive, with and without a deadline, and the timing "
    "of the wait: one message's life",
}
"""Functions longer than `MAX_FUNCTION_LINES`, each with the reason it is one function."""

MAX_FUNCTION_LINES = 60


def _functions() -> dict[str, int]:
    """Every function and method of the package, the benchmarks, scripts and examples by
    `path::qualified.name`, with its length in lines."""
    found = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef) and child.end_lineno is not None:
                    found[f"{path}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, path, name + ".")

    for part in ("ppscope", "benchmarks", "scripts", "examples"):
        for path in (ROOT / part).rglob("*.py"):
            visit(ast.parse(path.read_text()), str(path.relative_to(ROOT)), "")
    return found


def test_no_function_over_60_lines_without_a_reason() -> None:
    """Files follow concepts, whatever their length; a function is read at once, or says why it cannot be."""
    functions = _functions()
    long = {name: n for name, n in functions.items() if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS}
    assert not long, f"split these, or list them in LONG_FUNCTIONS with the reason: {long}"
    stale = [name for name in LONG_FUNCTIONS if functions.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"these are short now (or gone): take them off LONG_FUNCTIONS: {stale}"


def _imported_from_packages() -> dict[str, dict[str, str]]:
    """Package -> {name: module} of what modules outside it import from its modules: the scan
    `scripts/public_names.py` writes the tables from, so the test and the tool agree by construction."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("public_names", ROOT / "scripts" / "public_names.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    found: dict[str, dict[str, str]] = script.imported()
    return found


def test_every_package_states_the_names_other_parts_import_from_it() -> None:
    """A package's `__all__` covers what the rest of ppscope imports from its modules, and each name in it is
    there: a helper one part starts to borrow from another shows up here (`scripts/public_names.py --write`)."""
    import importlib

    for package, names in _imported_from_packages().items():
        if package == "ppscope" or not names:
            continue
        module = importlib.import_module(package)
        public = set(getattr(module, "__all__", ()))
        assert set(names) <= public, (
            f"{package}.__all__ lacks {sorted(set(names) - public)}: run scripts/public_names.py --write"
        )
        for name in public:
            assert getattr(module, name) is not None, f"{package}.{name}"


def test_test_files_are_named_by_the_part_they_test() -> None:
    """`test_<part>_<subject>.py`: a part of the package (a folder or a top-level module), `bench` for the
    benchmarks, or `project` for checks of the whole (packaging, documents)."""
    parts = {p.stem if p.is_file() else p.name for p in (ROOT / "ppscope").iterdir() if not p.name.startswith("_")}
    parts |= {"bench", "project"}
    odd = [
        p.name
        for p in (ROOT / "tests").glob("test_*.py")
        if not any(p.stem == f"test_{part}" or p.stem.startswith(f"test_{part}_") for part in parts)
    ]
    assert not odd, f"name these test_<part>_<subject>.py, parts being {sorted(parts)}: {odd}"

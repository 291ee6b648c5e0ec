"""docs/GLOSSARY.md against the outputs: every key of every command's `--json` has a row (name, unit,
statistic), and every row's key is still written by some output or by the code, so the glossary cannot rot.

The commands run in this process on small real inputs (the Kineto captures and Megatron-style timer traces in
tests/data, runs the simulator writes); `run`, `tune` and `demo` need the engine, so their keys come from the
code that writes them: `run`'s summary type, and `TuneResult.to_dict` / `demo_json` on a small result made
here without running anything.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from ppscope.cli.main import main

if typing.TYPE_CHECKING:
    from ppscope.engine.tuning import TuneResult

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "GLOSSARY.md"
DATA = ROOT / "tests" / "data"

_SECTION = re.compile(r"^## `([a-z ]+)`", re.M)  # "## `analyze`": the rows below are that output's keys
_ROW = re.compile(r"^\| `([^`]+)` \|", re.M)


def _expand(path: str) -> list[str]:
    """`model_costs.{embed,head}.ms` -> both paths."""
    m = re.search(r"\{([^}]*)\}", path)
    if m is None:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expand(path[: m.start()] + alt + path[m.end() :])]


def glossary() -> dict[str, set[str]]:
    """Section (an output: `analyze`, `rebalance`, ...) -> the key paths its table documents."""
    text = GLOSSARY.read_text(encoding="utf-8")
    heads = list(_SECTION.finditer(text))
    out: dict[str, set[str]] = {}
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() : nxt.start() if nxt else len(text)]
        out[head.group(1)] = {p for row in _ROW.findall(body) for p in _expand(row)}
    return out


def _paths(value: object, maps: set[str], prefix: str = "") -> Iterator[str]:
    """Every dict key below `value` as a path (`stages[].causes.fill`); a key of a map whose keys are data
    (a glossary path `stages[].causes.*`) is `*`."""
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.*" if prefix in maps else f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _paths(inner, maps, path)
    elif isinstance(value, list):
        for inner in value:
            yield from _paths(inner, maps, f"{prefix}[]")


def _maps(paths: set[str]) -> set[str]:
    return {p[: m.start()] for p in paths for m in re.finditer(r"\.\*", p)}


def _tune_result(tmp: Path) -> TuneResult:
    """A `TuneResult` with every part set, made without running the engine."""
    from ppscope.balance.advise.advice import Advice, Interval, Simulated
    from ppscope.balance.advise.cores import SharedCores
    from ppscope.balance.advise.problem import BalanceProblem
    from ppscope.balance.advise.rebalance import rebalance
    from ppscope.balance.costs import LayerCosts
    from ppscope.engine.tuning import RunSummary, TuneResult

    costs = LayerCosts(layer_ms=(1.0,) * 8, embed_ms=0.1, head_ms=3.0, sample_ms=0.1)
    advice = rebalance(BalanceProblem(costs=costs, stages=2), current=(4, 4))
    interval = Interval(low=1.1, high=1.3, how="block bootstrap")

    def summary(split: tuple[int, ...]) -> RunSummary:
        return RunSummary(
            run_dir=tmp,
            split=split,
            throughput_tokens_per_s=100.0,
            bubble_ratio=0.2,
            bottleneck_stage=1,
            time_per_mb_ns=(1_000_000, 1_000_000),
        )

    cores = SharedCores(cores=2, busy_beside=0.5, free=1.5, slowest_stage_speedup=1.2, speedup=1.1, interval=interval)
    return TuneResult(
        before=summary((4, 4)),
        after=summary(tuple(advice.proposed.split)),
        reruns=(summary((4, 4)),),
        advice=advice,
        costs=costs,
        cost_source="insitu",
        simulated=Simulated(speedup=1.1, hop_latency_ns=300_000, overhead_ms=0.1),
        predicted_interval=interval,
        measured_interval=interval,
        decision=Advice(change=True, reason="the gain is real"),
        cores=cores,
        measurement="decided after 3 pairs",
        decided=True,
        busy_cores_beside=0.5,
        emulated="emulated llama3-8b on h100-sxm",
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[object]]:
    """Section -> the JSON its command printed on each input."""
    capsys = _Capture()
    tmp = tmp_path_factory.mktemp("glossary")
    sim, serve, moved = tmp / "sim", tmp / "serve", tmp / "moved"
    pipelining, timers = DATA / "pipelining" / "1f1b", DATA / "megatron-timers" / "last-stage-slow.json.gz"
    sim_args = ["--stages", "2", "--microbatches", "2", "--layers", "4", "--layer-cost-ms", "1", "--head-cost-ms", "2"]
    got: dict[str, list[object]] = {s: [] for s in ("analyze", "rebalance", "simulate", "plan", "error")}
    got["simulate"] += [
        capsys.json("simulate", "--schedule", "gpipe", *sim_args, "--out", str(sim)),
        capsys.json("simulate", "--schedule", "serve", *sim_args, "--out", str(serve)),
        capsys.json("simulate", "--from", str(sim), "--split", "3,1", "--out", str(moved)),
    ]
    got["analyze"] += [capsys.json("analyze", str(p)) for p in (pipelining, timers, serve)]
    got["rebalance"] += [
        capsys.json("rebalance", str(sim)),
        capsys.json("rebalance", "--layer-costs", "1,1,1,2", "--stages", "2", "--head-cost", "1"),
        capsys.json(
            "rebalance",
            "--layers",
            "32",
            "--layer-cost-ms",
            "1",
            "--stages",
            "4",
            "--model",
            "llama3-8b",
            "--gpu-mem-gib",
            "80",
        ),
        capsys.json("rebalance", "--model", "llama3-8b", "--stages", "4", "--gpu", "h100-sxm"),
        capsys.json("rebalance", str(pipelining), "--current-split", "2,2"),
        capsys.json("rebalance", str(pipelining), "--model", "llama3-8b"),
    ]
    got["plan"] += [
        capsys.json("plan", "--model", "llama3-70b", "--gpus", "8"),
        capsys.json("plan", "--model", "llama3-70b", "--gpus", "8", "--gpu", "h100-sxm"),
    ]
    got["error"].append(capsys.json("analyze", str(tmp / "nothing"), code=2))
    for section, printed in _engine_outputs(tmp).items():
        got.setdefault(section, []).extend(printed)
    return got


def _engine_outputs(tmp: Path) -> dict[str, list[object]]:
    """`run`, `tune` and `demo` run the engine: their keys from the code that writes them."""
    from ppscope.cli.commands import run
    from ppscope.cli.commands.demo import demo_json

    tuned = _tune_result(tmp)
    summary = dict.fromkeys(typing.get_type_hints(run._Summary))
    tune = tuned.to_dict()
    demo = demo_json(tuned)
    # each holds another output whole: the demo all of tune's, tune the split search's keys of rebalance's
    search, demo["tune"], tune["rebalance"] = tune["rebalance"], None, None
    return {"run": [summary], "tune": [tune], "demo": [demo], "rebalance": [search]}


class _Capture:
    """capsys for a module-scoped fixture: the commands' stdout, read back."""

    def json(self, *argv: str, code: int = 0) -> object:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            got = main([*argv, "--json"])
        assert got == code, err.getvalue()
        return json.loads(out.getvalue())


def test_every_key_of_every_output_is_in_the_glossary(outputs: dict[str, list[object]]) -> None:
    documented = glossary()
    for section, printed in outputs.items():
        rows = documented.get(section, set())
        keys = {p for out in printed for p in _paths(out, _maps(rows))}
        assert not keys - rows, f"`{section}` keys without a row in docs/GLOSSARY.md: {sorted(keys - rows)}"


def test_every_key_in_the_glossary_is_still_written(outputs: dict[str, list[object]]) -> None:
    """A row whose key no output printed here (its parent was null on these inputs) must at least be written by
    the code, as a string literal or a field of a dataclass that is dumped whole."""
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "ppscope").rglob("*.py"))
    for section, rows in glossary().items():
        printed = {p for out in outputs.get(section, []) for p in _paths(out, _maps(rows))}
        for path in rows - printed:
            leaf = path.rsplit(".", 1)[-1].removesuffix("[]")
            if leaf == "*":
                continue
            assert re.search(rf"[\"']{re.escape(leaf)}[\"']|^\s+{re.escape(leaf)}: ", code, re.M), (
                f"docs/GLOSSARY.md documents `{path}` under `{section}`, which nothing writes any more"
            )


def _ns_values(value: object, maps: set[str], prefix: str = "", under_ns: bool = False) -> Iterator[object]:
    """Every value under a key ending `_ns`, a map's values included; a map's own keys are data, not units
    (`hops[].unmeasured` maps `recv_ns` to why it is null)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            data = prefix in maps
            path = f"{prefix}.*" if data else f"{prefix}.{key}" if prefix else str(key)
            yield from _ns_values(inner, maps, path, under_ns or (not data and str(key).endswith("_ns")))
    elif isinstance(value, list):
        for inner in value:
            yield from _ns_values(inner, maps, f"{prefix}[]", under_ns)
    elif under_ns:
        yield value


def test_a_time_in_ns_is_whole_ns(outputs: dict[str, list[object]]) -> None:
    """The glossary's rule: `_ns` keys hold integers (a median or busy ÷ passes is rounded)."""
    documented = glossary()
    for section, printed in outputs.items():
        maps = _maps(documented.get(section, set()))
        values = [v for out in printed for v in _ns_values(out, maps)]
        assert all(v is None or type(v) is int for v in values), (section, {type(v) for v in values})


def test_the_glossary_gives_every_row_a_unit() -> None:
    units = {"ns", "ms", "s", "µs", "B", "GiB", "GB", "tokens", "tokens/s", "ratio 0–1", "factor ×", "count", "–"}
    units |= {"GB/s", "TB/s", "TFLOPS", "FLOP", "signed share", "1/s", "layers", "points"}
    text = GLOSSARY.read_text(encoding="utf-8")
    for line in text.splitlines():
        if _ROW.match(line):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[2] in units, f"unit {cells[2]!r} of {cells[0]} is not one of the glossary's units"


def test_the_paths_helper_marks_data_keys() -> None:
    """A sanity check of the walker the tests above rest on."""
    got = set(_paths({"stages": [{"causes": {"fill": 1}}], "x": None}, {"stages[].causes"}))
    assert got == {"stages", "stages[].causes", "stages[].causes.*", "x"}
    assert _expand("a.{b,c}.d") == ["a.b.d", "a.c.d"]
    assert _maps({"a.*.*", "b"}) == {"a", "a.*"}
    assert dataclasses.is_dataclass(_tune_result(Path()))

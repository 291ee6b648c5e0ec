"""The Streamlit app on recorded runs, through streamlit.testing (no browser): sections, figures, safety."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("streamlit")
from error_helpers import raises_code
from streamlit.testing.v1 import AppTest
from test_dashboard_runs import record_gpipe_run, span_count

from ppscope.dashboard.safety import md

TIMEOUT_S = 60


def _app(*paths: Path) -> AppTest:
    def script(argv: list[str]) -> None:
        from ppscope.dashboard.app import main

        main(argv)

    return AppTest.from_function(script, args=([str(p) for p in paths],), default_timeout=TIMEOUT_S)


def _decode(values: Any) -> list[Any]:
    """A plotly array from the figure spec: a plain list, or {dtype, bdata} typed-array encoding."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"])).tolist()
    return list(values)


def _span_bars(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in spec["data"] if t.get("type") == "bar" and (t.get("meta") or {}).get("role") == "spans"]


def _chart_specs(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_timeline_draws_every_span(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=3, m=4)
    at = _app(run).run()
    assert not at.exception, at.exception
    assert at.subheader[0].value == md(str(run))
    assert any("Pipeline timeline" in m.value for m in at.markdown)
    spec = _chart_specs(at)[0]
    bars = _span_bars(spec)
    assert sum(len(_decode(t["base"])) for t in bars) == span_count(3, 4)
    # coloured by micro-batch: one trace per micro-batch
    assert sorted(t["name"] for t in bars) == [f"mb {m}" for m in range(4)]
    gap_traces = [t for t in spec["data"] if (t.get("meta") or {}).get("role") == "gap"]
    assert {t["name"] for t in gap_traces} >= {"idle: fill", "idle: drain"}
    assert "one bar each" in at.caption[-1].value


def test_the_app_prints_none_of_its_own_source(tmp_path: Path) -> None:
    # Streamlit's "magic" writes every bare expression of the app's script on the page: a docstring under a
    # constant would be shown above every page.
    import ast

    from ppscope.dashboard import app

    tree = ast.parse(Path(app.__file__).read_text(encoding="utf-8"))
    bare = [n.lineno for n in tree.body[1:] if isinstance(n, ast.Expr)]
    assert bare == [], f"bare expressions at module level of app.py, lines {bare}"
    at = _app(record_gpipe_run(tmp_path / "run", p=2, m=2)).run()
    assert not any("first view" in m.value for m in at.markdown)


def test_colour_toggle_and_window(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4)
    at = _app(run).run()
    at.radio(key="color_by").set_value("kind").run()
    assert not at.exception
    names = sorted(t["name"] for t in _span_bars(_chart_specs(at)[0]))
    assert names == ["forward", "recv_wait", "send"]
    at.radio(key="window_mode").set_value("Last …").run()
    at.number_input(key="last_ms").set_value(0.15).run()
    assert not at.exception
    shown = sum(len(_decode(t["base"])) for t in _span_bars(_chart_specs(at)[0]))
    assert 0 < shown < span_count(2, 4)


@pytest.mark.parametrize(
    ("section", "expect"),
    [
        ("Stages", "Stages: busy time and bubbles"),
        ("GPU usage", "Device usage"),
        ("Rebalance", "Rebalance"),
        ("Compare", "Compare two runs"),
        ("Requests", "Requests: latency"),
    ],
)
def test_every_section_renders(tmp_path: Path, section: str, expect: str) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4, requests=6)
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value(section).run()
    assert not at.exception, at.exception
    assert any(expect in m.value for m in at.markdown)


def test_stages_section_names_the_theory(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4)
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Stages").run()
    text = " ".join(m.value for m in at.markdown)
    assert "GPipe (P-1)/(M+P-1)" in text and "P=2, M=4" in text
    assert [m.label for m in at.metric][:3] == ["Bubble ratio", "Imbalance", "Bottleneck"]
    stage_spec = _chart_specs(at)[0]
    assert stage_spec["data"][0]["name"] == "busy"


def test_cpu_usage_is_labelled_as_cpu(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run")
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("GPU usage").run()
    assert any("no GPU counters" in i.value for i in at.info)
    spec = _chart_specs(at)[0]
    assert sorted(t["name"] for t in spec["data"]) == ["rank 0", "rank 1"]


@pytest.mark.parametrize("p", [1, 2])
def test_each_gpu_panel_names_its_lines(tmp_path: Path, p: int) -> None:
    run = record_gpipe_run(tmp_path / "run", p=p, gpu=True)
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("GPU usage").run()
    assert not at.exception, at.exception
    spec = _chart_specs(at)[0]
    layout = spec["layout"]
    assert layout["showlegend"] is True  # even for one GPU, whose lone line plotly would leave unnamed
    memory = [t for t in spec["data"] if t["yaxis"] == "y2"]
    assert sorted(t["name"] for t in memory) == [f"rank {r} · gpu {r}" for r in range(p)]
    assert {t["legend"] for t in memory} == {"legend2"} and all(t["showlegend"] for t in memory)
    assert layout["legend2"]["title"]["text"] == "rank · GPU"
    top = layout["yaxis2"]["domain"][1]
    assert layout["legend2"]["y"] == top and layout["legend2"]["x"] > 1  # beside the memory panel, off its plot
    assert layout["xaxis2"]["title"]["text"] == "time since run start (ms)"  # as the Gantt's axis
    colour = {(t["name"], t["yaxis"]): t["line"]["color"] for t in spec["data"]}
    assert len(set(colour.values())) == p  # a colour per GPU drawn
    assert all(colour[name, "y"] == colour[name, "y2"] for name, _ in colour)  # a GPU is one colour in every panel


def test_requests_section_shows_distributions(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", requests=6)
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Requests").run()
    assert at.metric[0].value == "6"
    spec = _chart_specs(at)[0]
    assert [t["type"] for t in spec["data"]] == ["histogram", "histogram"]


def test_folder_of_runs_lists_only_runs_inside_it(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    record_gpipe_run(folder / "a", p=2, m=2)
    record_gpipe_run(folder / "b", p=2, m=3)
    outside = record_gpipe_run(tmp_path / "secret", p=2, m=2)
    (folder / "link").symlink_to(outside)
    (folder / "notes.txt").write_text("not a run")
    at = _app(folder).run()
    assert not at.exception
    assert sorted(at.sidebar.selectbox(key="trace").options) == ["runs/a", "runs/b"]
    at.sidebar.selectbox(key="trace").set_value("runs/b").run()
    assert sum(len(_decode(t["base"])) for t in _span_bars(_chart_specs(at)[0])) == span_count(2, 3)
    at.sidebar.radio(key="section").set_value("Compare").run()
    assert not at.exception
    assert at.dataframe, "the compare table is shown"
    assert at.selectbox(key="compare_with").options == ["runs/a"]
    _, gantt_a, gantt_b = _chart_specs(at)  # per-stage bars, then each run's timeline side by side
    assert sum(len(_decode(t["base"])) for t in _span_bars(gantt_a)) == span_count(2, 3)
    assert sum(len(_decode(t["base"])) for t in _span_bars(gantt_b)) == span_count(2, 2)


# A cell of a compared figure: a number with its unit (%, pp, ms, tokens/s, ×), a count, or — when not known.
_WRITTEN = re.compile(
    "^("
    + "|".join(
        [
            "—",
            r"[+-]?[\d,]+",  # a count
            r"[+-]?[\d,]+\.\d(%| pp)",  # a share, a difference of shares
            r"[+-]?[\d,]+\.\d{3} ms",
            r"×\d+\.\d{3}|[+-]\d+\.\d{3}",  # a factor, a difference of factors
            r"[+-]?[\d,]+(\.\d)? tokens/s",
        ]
    )
    + ")$"
)


def test_compare_writes_every_number_with_its_unit(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    record_gpipe_run(folder / "a", p=2, m=4, requests=4)
    record_gpipe_run(folder / "b", p=2, m=4, requests=4, fwd_ns=[100_000, 130_000])
    at = _app(folder).run()
    at.sidebar.radio(key="section").set_value("Compare").run()
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe]
    cells = {row["measure"]: row for row in table.to_dict("records")}
    assert list(table.columns) == ["measure", "A", "B", "B - A", "B / A"]
    for row in cells.values():
        for column in ("A", "B", "B - A", "B / A"):
            assert isinstance(row[column], str) and _WRITTEN.match(row[column]), (row["measure"], row[column])
    assert cells["bubble ratio"]["A"].endswith("%") and cells["bubble ratio"]["B - A"].endswith(" pp")
    assert cells["window (ms)"]["A"].endswith(" ms") and cells["window (ms)"]["B / A"].startswith("×")
    assert cells["balance speedup (max/mean)"]["B"].startswith("×")
    _, gantt_a, gantt_b = _chart_specs(at)  # each run's stage view: in ms, as its table
    assert gantt_a["layout"]["xaxis"]["title"]["text"] == gantt_b["layout"]["xaxis"]["title"]["text"]
    assert gantt_a["layout"]["xaxis"]["title"]["text"] == "time since run start (ms)"


def test_missing_path_is_a_message(tmp_path: Path) -> None:
    at = _app(tmp_path / "nope").run()
    assert not at.exception
    assert "does not exist" in at.error[0].value


def test_run_deleted_while_shown_is_a_message(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", status="running")
    at = _app(run).run()
    assert not at.exception
    import shutil

    from ppscope.dashboard.data import LiveTrace

    live = LiveTrace(run, is_run=True)
    live.refresh()
    shutil.rmtree(run)
    at.run()
    assert not at.exception
    live.refresh()
    assert live.gone and any(md(live.error) in w.value for w in at.warning)  # RunNotFoundError's message, shown


def test_rebalance_advises_moving_layers_off_the_slow_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Stage 2 takes twice as long with the same 2 layers: its layers cost 100 µs each, the others 50 µs.
    run = record_gpipe_run(tmp_path / "run", p=3, m=4, fwd_ns=[100_000, 100_000, 200_000])
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Rebalance").run()
    assert not at.exception, at.exception
    values = {m.label: m.value for m in at.metric}
    assert values["Current split"] == "2,2,2"
    assert values["Proposed split"] == "3,2,1"
    # the schedule replay leads, as in `ppscope rebalance RUN`: GPipe's fill and drain of 4 micro-batches over 3
    # stages take some of the slowest stage's ×1.333
    from ppscope.cli.main import main

    assert main(["rebalance", str(run), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["slowest_stage_speedup"] == pytest.approx(4 / 3) and 1.05 < cli["predicted_speedup"] < 4 / 3
    assert values["Predicted speedup"] == f"×{cli['predicted_speedup']:.3f}"
    said = [s.value.replace("\\", "") for s in at.success]  # markdown's escapes off
    assert any(
        s.startswith(
            f"Advice: change the split. predicted speedup ×{cli['predicted_speedup']:.3f} (no interval: the run"
        )
        for s in said
    )
    code = at.code[0].value
    assert "VLLM_PP_LAYER_PARTITION=3,2,1" in code and "SGLANG_PP_LAYER_PARTITION=3,2,1" in code
    # the simulated timeline of the advised split sits beside the measured one
    specs = _chart_specs(at)
    assert len(specs) == 3  # predicted stage times, measured Gantt, simulated Gantt
    measured, simulated = specs[1], specs[2]
    assert sum(len(_decode(t["base"])) for t in _span_bars(measured)) == span_count(3, 4)
    assert _span_bars(simulated), "the simulated Gantt has bars"
    replay = next(m.value for m in at.markdown if "Simulated replay" in m.value)
    current_ms, advised_ms = (float(x) for x in re.findall(r"split ([0-9.]+) ms", replay))
    assert advised_ms < current_ms


def test_rebalance_prefers_the_runs_layer_profile_to_fitted_costs(tmp_path: Path) -> None:
    from ppscope.balance.measured.profile import PROFILE_FILE, LayerProfile, PhaseCosts

    # The spans say stage 2 is slow (advice 3,2,1); the profile says layers 0 and 1 are the heavy ones.
    run = record_gpipe_run(tmp_path / "run", p=3, m=4, fwd_ns=[100_000, 100_000, 200_000])
    phase = PhaseCosts(layer_ms=(0.3, 0.3, 0.05, 0.05, 0.05, 0.05), embed_ms=0.0, head_ms=0.0, sample_ms=0.0, tokens=4)
    profile = LayerProfile(
        model="tiny", device="cpu", dtype="float32", method="perf_counter", repeats=3, prefill=phase, decode=phase
    )
    (run / PROFILE_FILE).write_text(json.dumps(profile.to_dict()))
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Rebalance").run()
    assert not at.exception, at.exception
    values = {m.label: m.value for m in at.metric}
    assert values["Proposed split"] == "1,1,4"
    assert any("per-layer profile (profile.json" in c.value for c in at.caption)


def test_rebalance_with_a_damaged_profile_says_so_and_fits_the_spans(tmp_path: Path) -> None:
    from ppscope.balance.measured.profile import PROFILE_FILE

    run = record_gpipe_run(tmp_path / "run", p=3, m=4, fwd_ns=[100_000, 100_000, 200_000])
    (run / PROFILE_FILE).write_text("{not json")
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Rebalance").run()
    assert not at.exception, at.exception
    from ppscope.balance.measured.profile import read_profile
    from ppscope.errors import CorruptFileError, ErrorCode

    with raises_code(CorruptFileError, ErrorCode.NOT_JSON) as err:
        read_profile(run)
    assert any(md(str(err.value)) in w.value for w in at.warning)  # the profile's error, shown
    assert {m.label: m.value for m in at.metric}["Proposed split"] == "3,2,1"


def test_rebalance_says_why_when_costs_cannot_be_fitted(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4)  # two stages, both first or last: extras not separable
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Rebalance").run()
    assert not at.exception
    assert "No advice for this trace" in at.error[0].value


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.slow
def test_real_nsys_export_renders_aggregated(tmp_path: Path) -> None:
    path = DATA / "nsys" / "mfu_2gpu_after.sqlite"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared real traces are not next to this checkout)")
    at = _app(path).run()
    assert not at.exception, at.exception
    spec = _chart_specs(at)[0]
    rows = set(spec["layout"]["yaxis"]["categoryarray"])
    assert any(t.get("meta", {}).get("role") == "binned" for t in spec["data"])
    for trace in spec["data"]:
        assert set(trace["y"] if isinstance(trace["y"], list) else []) <= rows, "no bar outside the rows"
    assert "aggregated" in at.caption[-1].value
    for section in ("Stages", "GPU usage", "Rebalance", "Requests"):
        at.sidebar.radio(key="section").set_value(section).run()
        assert not at.exception, (section, at.exception)


def test_range_window_slider(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4)
    at = _app(run).run()
    at.radio(key="window_mode").set_value("Range").run()
    slider = at.slider(key="range_ms")
    assert slider.value[0] == 0.0 and slider.max == pytest.approx(slider.value[1])
    slider.set_value((0.0, 0.05)).run()  # the first 50 µs: rank 0's first forward, rank 1 waiting for it
    assert not at.exception
    bars = _span_bars(_chart_specs(at)[0])
    assert sorted(y for t in bars for y in t["y"]) == ["rank 0 · compute", "rank 1 · recv"]


def test_empty_folder_waits_for_runs(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    at = _app(folder).run()
    assert not at.exception
    assert "No runs or traces" in at.info[0].value
    record_gpipe_run(folder / "first", p=2, m=2)
    at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key="trace").value == "runs/first"
    assert sum(len(_decode(t["base"])) for t in _span_bars(_chart_specs(at)[0])) == span_count(2, 2)


def test_names_from_files_show_as_written_not_as_markdown(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    record_gpipe_run(folder / "x*y_[link](http:z)$a$", p=2, m=2)
    at = _app(folder).run()
    assert not at.exception
    assert at.subheader[0].value == r"runs/x\*y\_\[link\]\(http\:z\)\$a\$"


def test_stages_section_shows_a_training_runs_replay(tmp_path: Path) -> None:
    from ppscope.simulate.simulator import write_run
    from ppscope.simulate.training import replay_order
    from ppscope.trace.actions import Action, ActionType
    from ppscope.trace.model import RunMeta, Trace

    order = {r: [Action(r, ActionType(t), m) for t in "FB" for m in range(4)] for r in range(2)}  # GPipe, P=2, M=4
    step = replay_order(order, {(s, t): 1000 * (1 + s) for s in range(2) for t in "FB"})
    rows = [
        {
            "rank": t.rank,
            "stage": t.action.stage,
            "mb": t.action.mb,
            "step": 0,
            "phase": t.action.type,
            "kind": "forward" if t.action.type == "F" else "backward",
            "lane": "compute",
            "start_ns": t.start_ns,
            "end_ns": t.end_ns,
        }
        for t in step.actions
    ]
    meta = RunMeta(source="pipelining", status="finished", world_size=2, pp_size=2, schedule="gpipe", microbatches=4)
    run = write_run(Trace.from_records(rows, meta=meta), tmp_path / "run")
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Stages").run()
    assert not at.exception, at.exception
    replay = next(m.value for m in at.markdown if m.value.startswith("**Replay**"))
    assert f"{step.bubble_ratio:.1%}" in replay.replace("\\", "") and "own action order" in replay
    table = next(d.value for d in at.dataframe if "what-if" in d.value.columns).set_index("what-if")
    assert list(table.index) == ["measured costs", "balanced", "no straggler"]  # one pipeline: no straggler, why
    assert table.loc["balanced", "speedup"] > 1 and "one replica" in table.loc["no straggler", "changes"]


def test_the_status_line_names_the_pipeline_engine_the_trace_shows() -> None:
    """A DeepSpeed capture's page says DeepSpeed, as `analyze` does."""
    capture = Path(__file__).parent / "data" / "deepspeed-pipeline"
    at = _app(capture).run()
    assert not at.exception, at.exception
    assert any("engine **DeepSpeed**" in c.value for c in at.caption)

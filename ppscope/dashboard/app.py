"""The Streamlit app of `ppscope dashboard`: pages that render what `ppscope` computes, and nothing more.

Started as `streamlit run ppscope/dashboard/app.py -- PATH...`; only those paths (and runs inside folders among
them) can be opened, picked from a list. Loading and tailing live in `ppscope.dashboard.data`, figures in
`ppscope.analysis.gantt` and `ppscope.dashboard.charts`, numbers in `ppscope.analysis`. No analysis happens here.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from ppscope.analysis import gantt
from ppscope.analysis.replica_report import stage_lanes
from ppscope.dashboard import advice, compare, jobpages, views
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.ranked import RANKS_IN_MEMORY, READ_SHARE, RankedRun
from ppscope.dashboard.safety import Catalog, Entry, catalog_from_args, md
from ppscope.errors import PPScopeError
from ppscope.trace.model import RunMeta, SpanKind
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.store import rank_file_count

__all__ = ["LANES", "RANKS_OPTION", "SECTIONS", "main"]

# Timeline lanes of a job of several data-parallel pipelines: each stage's median replica with its straggler, or
# the lanes of one rank picked from a list. (A comment: a bare string here would be printed on every page.)
LANES = ("One per stage", "One rank")
SECTIONS = ("Timeline", "Stages", "GPU usage", "Rebalance", "Compare", "Requests")
# The Timeline's first view is a few steps with each span drawn: a micro-batch can be followed, a bubble seen.
WINDOW_MODES = ("A few steps", "Whole run", "Last …", "Range")
# A few steps: each micro-batch in flight going round the pipeline this many times.
FEW_ROUNDS = 4
OVERVIEW_HEIGHT_PX = 220
# How often the timeline of a run being written re-reads what arrived. (No bare strings at module level:
# Streamlit's "magic" would print them on the page.)
REFRESH_S = 1.0
RANKS_OPTION = "--ranks-in-memory="
# The first argument may be RANKS_OPTION + N: runs of more rank files than N are shown a rank at a time.


@st.cache_resource(show_spinner=False)
def _catalog(paths: tuple[str, ...]) -> Catalog:
    return catalog_from_args(paths)


@st.cache_resource(show_spinner=False, max_entries=64)
def _live(path: str, is_run: bool) -> LiveTrace:
    # Keyed by a path that came from the catalog only; shared by every session of this server.
    from pathlib import Path

    return LiveTrace(Path(path), is_run=is_run)


def live_trace(entry: Entry) -> LiveTrace:
    return _live(str(entry.path), entry.is_run)


@st.cache_resource(show_spinner=False, max_entries=16)
def _ranked_run(path: str, limit: int, stamp: tuple[int, int]) -> RankedRun | None:
    # Keyed also by the run's state on disk, so that a run that finishes, is replaced or gains a rank file is
    # looked at again; not by its other files: SQLite's logs come and go as ranks open and close their files,
    # and each new instance reads every rank file again, whatever `READ_SHARE` allows.
    return RankedRun.open(Path(path), limit)


def ranked_run(entry: Entry, limit: int) -> RankedRun | None:
    """The entry as a large run shown a rank at a time, or None when it is loaded whole (`ranked.py` says when)."""
    if not entry.is_run:
        return None
    try:
        stamp = ((entry.path / "meta.json").stat().st_mtime_ns, rank_file_count(entry.path))
    except OSError:
        return None
    return _ranked_run(str(entry.path), limit, stamp)


def compare_side(entry: Entry, limit: int) -> compare.Side:
    """The run picked as B on the Compare page: read a rank at a time when it is large (the instance its own
    pages use, so a second look reads nothing), else loaded whole as its pages load it."""
    big = ranked_run(entry, limit)
    if big is not None:
        if big.live:
            big.refresh()  # cheap: looks at the files' sizes and times, lets go of what they changed
        return compare.ranked_side(big, entry.label)
    live = live_trace(entry)
    live.refresh()
    return compare.live_side(live, entry.label)


def _limit(argv: Sequence[str]) -> tuple[int, list[str]]:
    """The rank files a run may have and still be loaded whole, and the paths."""
    if argv and argv[0].startswith(RANKS_OPTION):
        text = argv[0].removeprefix(RANKS_OPTION)
        return (int(text) if text.isdigit() else RANKS_IN_MEMORY), list(argv[1:])
    return RANKS_IN_MEMORY, list(argv)


def main(argv: Sequence[str]) -> None:
    st.set_page_config(page_title="ppscope", layout="wide")
    limit, paths = _limit(argv)
    try:
        catalog = _catalog(tuple(paths))
    except PPScopeError as exc:
        st.error(f"ppscope dashboard: {md(exc)}")
        return
    entries = catalog.entries()
    st.sidebar.title("ppscope")
    if not entries:
        _wait_for_runs(catalog)
        return
    labels = [e.label for e in entries]
    _open_from_link(labels)
    label = st.sidebar.selectbox("Trace", labels, key="trace")
    entry = catalog.pick(label, entries)
    section = st.sidebar.radio("Section", SECTIONS, key="section")
    others = [e for e in entries if e.label != entry.label]
    big = ranked_run(entry, limit)
    if big is not None and not st.sidebar.checkbox(
        f"Load the whole run ({len(big.files):,} rank files)",
        key="whole_run",
        help="This run is shown a rank at a time; only the Rebalance page's simulated replay and timelines need "
        "every rank's spans in memory.",
    ):
        ranked_page(entry, big, section, others, limit)
        return
    live = live_trace(entry)
    live.refresh()
    _header(entry, live)
    if live.error and not len(live.trace.spans) and not live.live:
        return
    if section == "Timeline":
        timeline(live)
    elif section == "Stages":
        views.stages(live)
    elif section == "GPU usage":
        jobpages.usage(live)
    elif section == "Rebalance":
        advice.page(live)
    elif section == "Compare":
        side = dataclasses.replace(compare.live_side(live, entry.label), folder=entry.path.parent)
        compare.page(side, others, lambda e: compare_side(e, limit), compare.demo_headline(entry.path.parent))
    else:
        jobpages.requests(live)


# What a link may open (`?section=Compare&trace=A&compare_with=B`): the sidebar's section and trace, and
# Compare's B. `ppscope demo` opens on the comparison of its two splits so.
LINK_KEYS = ("section", "trace", "compare_with")


def _open_from_link(labels: Sequence[str]) -> None:
    """Start the page where the link says, once: only a section or a trace this dashboard offers is taken (a
    link never names a path), and what the user picks afterwards stays."""
    valid = {"section": SECTIONS, "trace": labels, "compare_with": labels}
    for key in LINK_KEYS:
        value = st.query_params.get(key)
        if value in valid[key] and key not in st.session_state:
            st.session_state[key] = value


def _wait_for_runs(catalog: Catalog) -> None:
    folders = ", ".join(md(f) for f in catalog.folders)
    st.info(f"No runs or traces in {folders} yet. This page shows them as they appear.")

    @st.fragment(run_every=REFRESH_S * 2)
    def look() -> None:
        if catalog.entries():
            st.rerun()

    look()


def _header(entry: Entry, live: LiveTrace) -> None:
    st.subheader(md(entry.label))

    # While the run is written, the status line follows what the timeline's refresh has read.
    @st.fragment(run_every=REFRESH_S if live.live else None)
    def status() -> None:
        st.caption(_status_line(entry, live.meta))
        if live.error:
            st.warning(md(live.error))
        _header_warnings(live.trace.warnings)

    status()


def _header_warnings(warnings: Sequence[Notice]) -> None:
    """A run's warnings under its title, but for missing ranks: the Stages page names them, with what they
    withhold, whether the run is in memory or read a rank at a time."""
    for warning in warnings:
        if warning.code != NoticeCode.MISSING_RANKS:
            st.caption(f"⚠ {md(str(warning))}")


def _status_line(entry: Entry, meta: RunMeta) -> str:
    bits = [
        f"source **{md(meta.source)}**",
        f"status **{md(meta.status)}**" if entry.is_run else "imported trace",
        f"PP {meta.pp_size}",
        f"schedule {md(meta.schedule or 'unknown')}",
    ]
    if meta.pipeline_engine:
        bits.insert(1, f"engine **{md(meta.pipeline_engine)}**")
    if meta.split:
        bits.append(f"split {','.join(map(str, meta.split))}")
    return " · ".join(bits)


def ranked_page(entry: Entry, big: RankedRun, section: str, others: Sequence[Entry], limit: int) -> None:
    """A large run's page, read a rank at a time: its stage view, its stages' figures, the rebalancer's advice,
    its devices' usage, its comparison with one of `others` and its requests."""
    st.subheader(md(entry.label))
    st.caption(_status_line(entry, big.meta))
    try:
        run = big.replicas()
    except PPScopeError as exc:
        st.error(md(exc))
        return
    _header_warnings(run.said)
    ra = run.analysis
    if ra is None:  # the run changed on disk since it was looked at: no longer many pipelines
        st.error("This run is no longer a job of several pipelines: tick 'Load the whole run' to show it.")
        return
    if big.live:
        _follow(big)
    if section == "Timeline":
        ranked_timeline(big)
    elif section == "Stages":
        views.stage_page(ra, ra.results.get(ra.shown_replica), "no replica recorded spans")
    elif section == "Rebalance":
        advice.page_ranked(big)
    elif section == "GPU usage":
        jobpages.usage_ranked(big)
    elif section == "Compare":
        compare.page(compare.ranked_side(big, entry.label), others, lambda e: compare_side(e, limit))
    else:
        jobpages.requests_ranked(big)


def _follow(big: RankedRun) -> None:
    """While a large run is written: look at its files every REFRESH_S and redraw the page when `refresh` has
    let go of what was read (a rank wrote, and the last read is old enough: `ranked.READ_SHARE`)."""
    st.caption(
        "Live: this run is still being written. Its rank files are read again, each alone, once they change; at "
        f"most every {READ_SHARE} times the last read's {big.read_s:.1f} s."
    )

    @st.fragment(run_every=REFRESH_S)
    def look() -> None:
        if big.refresh():
            st.rerun()

    look()


@dataclass(frozen=True)
class _Look:
    """The timeline's controls."""

    color_by: str
    shade: bool
    mode: str
    last_ms: float


def _controls() -> _Look:
    c1, c2, c3 = st.columns([2, 2, 3])
    color_by = c1.radio("Colour bars by", gantt.COLOR_MODES, horizontal=True, key="color_by")
    shade = c2.checkbox("Shade idle gaps by cause", value=True, key="shade")
    mode = c3.radio("Time window", WINDOW_MODES, horizontal=True, key="window_mode")
    last_ms = st.number_input("Last (ms)", min_value=0.1, value=100.0, key="last_ms") if mode == "Last …" else 0.0
    return _Look(str(color_by), bool(shade), str(mode), float(last_ms))


def timeline(live: LiveTrace) -> None:
    st.markdown("### Pipeline timeline")
    look = _controls()
    started_live = live.live
    ra, placement = views.replicas(live)
    lanes, rank = LANES[0], -1
    if ra is not None and placement is not None:  # many pipelines: never one lane per rank of the job
        lanes = st.radio("Lanes", LANES, horizontal=True, key="lanes")
        if lanes == LANES[1]:
            rank = st.selectbox("Rank", sorted(live.trace.ranks), key="lane_rank")

    @st.fragment(run_every=REFRESH_S if started_live else None)
    def draw() -> None:
        trace = live.refresh()
        if started_live and not live.live:
            st.rerun()  # the run finished (or vanished): redraw once without the timer
        spans = trace.spans
        if not len(spans):
            st.info("No spans yet." + (" Waiting for the run to write some…" if live.live else ""))
            return
        origin = int(spans["start_ns"].min())
        end = int(spans["end_ns"].max())
        gaps, stage_ranks = None, None
        if ra is not None and placement is not None:
            spans = stage_lanes(spans, ra, placement) if rank < 0 else spans[spans["rank"].to_numpy() == rank]
            _replica_caption(len(ra.replicas), rank)
        elif look.shade:
            result, problem = views.analysis(live)
            if result is not None:
                gaps, stage_ranks = result.gaps, {s.stage: s.ranks for s in result.stages}
            else:
                st.caption(f"Idle gaps are not shaded: {md(problem)}")
        few = _few_steps(spans, trace.meta.microbatches) if look.mode == WINDOW_MODES[0] else None
        if few is not None:
            few = _overview(spans, origin) or few
        note = _gantt(spans, look, origin, end, gaps, stage_ranks, few)
        st.caption(note + (f" Live: refreshing every {REFRESH_S:g} s." if live.live else ""))

    draw()


def ranked_timeline(big: RankedRun) -> None:
    """The timeline of a large run: one lane per stage and its straggler, or one rank's lanes when picked, each
    read from those ranks' files alone; placed on the run's own time axis (its first and last span)."""
    st.markdown("### Pipeline timeline")
    look = _controls()
    run = big.replicas()
    lanes = st.radio("Lanes", LANES, horizontal=True, key="lanes")
    rank = st.selectbox("Rank", big.ranks, key="lane_rank") if lanes == LANES[1] else -1
    try:
        spans = big.stage_spans() if rank < 0 else big.rank_spans(int(rank))
    except PPScopeError as exc:
        st.error(md(exc))
        return
    if not len(spans):
        st.info("No spans to draw.")
        return
    assert run.analysis is not None  # a RankedRun is a job of replicas
    _replica_caption(len(run.analysis.replicas), int(rank))
    note = _gantt(spans, look, run.first_ns, run.last_ns, None, None)
    st.caption(f"{note} Read a rank at a time: {len(big.files):,} rank files, these lanes' spans alone in memory.")


def _replica_caption(replicas: int, rank: int) -> None:
    what = "each stage's median replica and its straggler (▲)" if rank < 0 else f"rank {rank}'s own lanes"
    st.caption(f"{replicas} data-parallel pipelines: showing {what}.")


def _gantt(
    spans: pd.DataFrame,
    look: _Look,
    origin: int,
    end: int,
    gaps: pd.DataFrame | None,
    stage_ranks: Mapping[int, Sequence[int]] | None,
    few: tuple[int, int] | None = None,
) -> str:
    """Draw the Gantt chart of `spans` on the run's time axis; its note. `few`: the window of a few steps."""
    view = gantt.gantt_figure(
        spans,
        color_by=look.color_by,
        gaps=gaps,
        stage_ranks=stage_ranks,
        window_ns=few or _window(look.mode, origin, end, look.last_ms),
        origin_ns=origin,
    )
    st.plotly_chart(view.figure, key="gantt", config={"displaylogo": False})
    return view.note


def _few_steps(spans: pd.DataFrame, inflight: int) -> tuple[int, int] | None:
    """The newest few steps: from the start of the first stage's `FEW_ROUNDS` × `inflight`-th newest forward
    pass (each micro-batch going round that many times) to the last span; None when that is the whole run."""
    forward = spans[spans["kind"].to_numpy() == str(SpanKind.FORWARD)]
    if not len(forward):
        return None
    first = forward[forward["stage"].to_numpy() == forward["stage"].min()]
    passes = FEW_ROUNDS * max(inflight, 1)
    if len(first) <= passes:
        return None
    starts = np.sort(first["start_ns"].to_numpy(np.int64))
    return int(starts[-passes]), int(spans["end_ns"].max())


def _overview(spans: pd.DataFrame, origin: int) -> tuple[int, int] | None:
    """The whole run as a strip above the window, each row's busy share in time bins; the window a drag across
    it picked, or None (then the Gantt below shows the newest few steps)."""
    view = gantt.overview_figure(spans, origin, OVERVIEW_HEIGHT_PX)
    event = st.plotly_chart(
        view.figure, key="overview", on_select="rerun", selection_mode="box", config={"displaylogo": False}
    )
    picked = gantt.picked_window(event.get("selection") if event else None, origin)
    if picked is None:
        st.caption(
            "Below, the newest few steps, each span drawn: drag across the strip to see another window, or pick "
            "Whole run, Last … or Range."
        )
    else:
        lo, hi = ((t - origin) / 1e6 for t in picked)
        st.caption(
            f"Below, the window picked on the strip, {lo:,.1f}–{hi:,.1f} ms: drag again for another, double-click "
            "the strip for the newest few steps."
        )
    return picked


def _window(mode: str, origin_ns: int, end_ns: int, last_ms: float) -> tuple[int, int] | None:
    if mode == "Last …":
        return max(origin_ns, end_ns - int(last_ms * 1e6)), end_ns
    if mode == "Range":
        total_ms = max((end_ns - origin_ns) / 1e6, 0.001)
        lo, hi = st.slider("Window (ms since run start)", 0.0, total_ms, (0.0, total_ms), key="range_ms")
        return origin_ns + int(lo * 1e6), origin_ns + int(hi * 1e6)
    return None


if __name__ == "__main__":
    main(sys.argv[1:])

"""The GPU usage and Requests pages, for a trace in memory and for a large run shown a rank at a time.

A job of several data-parallel pipelines gets, on both paths, the same page: its devices' usage summed up per
stage and per replica (`charts.usage_tables`) with one rank's counters drawn when it is picked, never a line per
device of the job; and its request latency (from `requests.jsonl`, which the launcher writes beside the rank
files) with each replica's output tokens/s (counted from its last stage's `sample` spans by the replica's own
analysis). A large run (`RankedRun`) reads its counters a rank file at a time without the spans, and its request
log alone; a trace in memory takes the same figures from its frames, so the two pages show the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from ppscope.dashboard import charts, views
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.ranked import RankedRun
from ppscope.dashboard.safety import md
from ppscope.errors import PPScopeError

if TYPE_CHECKING:
    from ppscope.analysis import RequestLatency
    from ppscope.analysis.replicas import ReplicaAnalysis

__all__ = ["requests", "requests_ranked", "usage", "usage_ranked"]

_NO_COUNTERS = "This run recorded no GPU or CPU counters (the engine samples them while it runs)."


def usage(live: LiveTrace) -> None:
    """The page of a trace in memory: a line per device, or for a job of several pipelines its summaries."""
    trace = live.trace
    origin = int(trace.spans["start_ns"].min()) if len(trace.spans) else 0
    _, placement = views.replicas(live)
    if placement is not None:
        rows = live.memo("usage_rows", lambda t: charts.usage_rows(t.counters))
        counters = trace.counters
        job_usage(rows, placement.place, lambda r: counters[counters["rank"].to_numpy() == r], origin)
        return
    st.markdown("### Device usage")
    view = live.memo("usage", lambda t: charts.usage_figure(t.counters, origin_ns=origin))
    if view is None:
        if live.is_run:
            st.info(_NO_COUNTERS)
        else:
            st.info(f"This {md(live.meta.source)} trace carries no GPU or CPU counters that ppscope imports.")
        return
    (st.success if view.device == "gpu" else st.info)(view.label)
    st.plotly_chart(view.figure, key="usage", config={"displaylogo": False})


def usage_ranked(big: RankedRun) -> None:
    """The page of a large run: its counters read a rank file at a time (no spans), summed up per rank."""
    run = big.replicas()
    assert run.placement is not None  # a RankedRun is a job of replicas
    rows, damaged = big.usage()
    job_usage(rows, run.placement.place, big.rank_counters, run.first_ns)
    for why in damaged:
        st.caption(f"⚠ left out, its file cannot be read: {md(why)}")
    st.caption(f"Read a rank at a time: the counters of {len(big.files):,} rank files, without their spans.")


def job_usage(
    rows: pd.DataFrame, place: Mapping[int, tuple[int, int]], counters_of: Callable[[int], pd.DataFrame], origin: int
) -> None:
    """A job's usage: per stage and per replica (`usage_tables` of each rank's `usage_rows`), then the counters of
    one rank, picked from a list, over time (`counters_of(rank)`, on the run's time axis from `origin`)."""
    st.markdown("### Device usage")
    if not len(rows):
        st.info(_NO_COUNTERS)
        return
    by_stage, by_replica = charts.usage_tables(rows, place)
    st.markdown("**Per stage**, over its replicas' devices")
    st.dataframe(by_stage, hide_index=True)
    st.markdown("**Per replica**, over its stages' devices")
    st.dataframe(by_replica, hide_index=True)
    rank = st.selectbox("Rank", sorted({int(r) for r in rows["rank"]}), key="usage_rank")
    try:
        view = charts.usage_figure(counters_of(int(rank)), origin_ns=origin)
    except PPScopeError as exc:
        st.error(md(exc))
        return
    if view is None:
        st.info(f"Rank {rank} recorded no counters.")
        return
    (st.success if view.device == "gpu" else st.info)(f"Rank {rank}: {view.label}")
    st.plotly_chart(view.figure, key="usage", config={"displaylogo": False})


def requests(live: LiveTrace) -> None:
    """The page of a trace in memory: the request log's latency, and each replica's tokens/s."""
    from ppscope.analysis.analyzer import run_latency

    ra, _ = views.replicas(live)
    requests_page(live.memo("latency", lambda t: run_latency(t.requests, t.meta)), ra)


def requests_ranked(big: RankedRun) -> None:
    """The page of a large run: its request log alone, and the replicas' tokens/s their analysis counted."""
    from ppscope.analysis.analyzer import run_latency

    try:
        latency = big.memo("latency", lambda: run_latency(big.requests(), big.meta))
    except PPScopeError as exc:
        st.error(md(exc))
        return
    requests_page(latency, big.replicas().analysis)


def requests_page(lat: RequestLatency | None, ra: ReplicaAnalysis | None) -> None:
    """TTFT, TPOT, end to end and tokens/s of the run's requests; for a job of several pipelines, then each
    replica's output tokens/s."""
    st.markdown("### Requests: latency")
    if lat is None:
        st.info("This trace has no request log (`requests.jsonl`, which ppscope's engine writes as requests finish).")
    else:
        _latency(lat)
    if ra is not None:
        _replica_tokens(ra)


def _latency(lat: RequestLatency) -> None:
    cols = st.columns(4)
    cols[0].metric("Requests", f"{lat.requests:,}", help=f"{lat.finished:,} finished")
    cols[1].metric("TTFT p50", "—" if lat.ttft is None else f"{lat.ttft.p50_ms:,.1f} ms")
    cols[2].metric("TPOT p50", "—" if lat.tpot is None else f"{lat.tpot.p50_ms:,.2f} ms")
    cols[3].metric("Output tokens/s", "—" if lat.tokens_per_s is None else f"{lat.tokens_per_s:,.0f}")
    fig = charts.latency_figure(lat)
    if fig is None:
        st.info("No request has both an arrival and a first token yet.")
    else:
        st.plotly_chart(fig, key="latency", config={"displaylogo": False})
    stats = [("TTFT", lat.ttft), ("TPOT", lat.tpot), ("end to end", lat.e2e)]
    st.dataframe([{"measure": name, **vars(s)} for name, s in stats if s is not None], hide_index=True)


def _replica_tokens(ra: ReplicaAnalysis) -> None:
    """Each replica's output tokens/s and how it was counted (its last stage's `sample` spans in its window)."""
    rows = []
    for rep in ra.replicas:
        result = ra.results.get(rep.replica)
        tp = None if result is None else result.throughput_tokens_per_s
        rows.append(
            {
                "replica": rep.replica,
                "output tokens/s": None if tp is None else round(tp, 1),
                "bubble ratio": None if rep.bubble_ratio is None else round(rep.bubble_ratio, 4),
                "counted from": "nothing recorded" if result is None else result.throughput_basis,
            }
        )
    st.markdown(f"**{len(ra.replicas)} data-parallel pipelines**: each replica's output tokens/s")
    st.dataframe(rows, hide_index=True)

"""The analyzer: bubbles per stage and their causes, the bottleneck stage, theory vs measured, latency.

Pure functions: a `Trace` in, an `AnalysisResult` out. Nothing here prints, plots or writes files; the
report (`ppscope.analysis.report`) and figures (`ppscope.analysis.figures`) present the result.
"""

from __future__ import annotations

from ppscope.analysis.analyzer import AnalysisConfig, analyze
from ppscope.analysis.result import (
    CAUSES,
    AnalysisResult,
    Cause,
    HopStats,
    LatencyStats,
    Replay,
    RequestLatency,
    StageResult,
    Theory,
    TheoryGap,
    WindowInfo,
)
from ppscope.analysis.theory import (
    PassCosts,
    decode_bubble,
    dualpipev_bubble,
    gpipe_bubble,
    interleaved_bubble,
    theory_for,
    zb_h1_bubble,
    zbv_bubble,
)
from ppscope.analysis.window import parse_window_ms

__all__ = [
    "CAUSES",
    "AnalysisConfig",
    "AnalysisResult",
    "Cause",
    "HopStats",
    "LatencyStats",
    "PassCosts",
    "Replay",
    "RequestLatency",
    "StageResult",
    "Theory",
    "TheoryGap",
    "WindowInfo",
    "analyze",
    "decode_bubble",
    "dualpipev_bubble",
    "gpipe_bubble",
    "interleaved_bubble",
    "parse_window_ms",
    "theory_for",
    "zb_h1_bubble",
    "zbv_bubble",
]

"""The analyzer: bubbles per stage and their causes, the bottleneck stage, theory vs measured, latency.

Pure functions: a `Trace` in, an `AnalysisResult` out. Nothing here prints, plots or writes files; the
report (`ppscope.analysis.report`) and figures (`ppscope.analysis.figures`) present the result.
"""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.analysis.analyzer import NO_SPANS as NO_SPANS
    from ppscope.analysis.analyzer import AnalysisConfig as AnalysisConfig
    from ppscope.analysis.analyzer import analyze as analyze
    from ppscope.analysis.analyzer import run_latency as run_latency
    from ppscope.analysis.bubbles import ROLE_COMPUTE as ROLE_COMPUTE
    from ppscope.analysis.bubbles import ROLE_SEND as ROLE_SEND
    from ppscope.analysis.bubbles import ROLE_WAIT as ROLE_WAIT
    from ppscope.analysis.bubbles import span_roles as span_roles
    from ppscope.analysis.facts import cpu_ranks as cpu_ranks
    from ppscope.analysis.intervals import Intervals as Intervals
    from ppscope.analysis.intervals import covered_within as covered_within
    from ppscope.analysis.intervals import running_max as running_max
    from ppscope.analysis.latency import request_latency as request_latency
    from ppscope.analysis.pipeline import message_latencies as message_latencies
    from ppscope.analysis.pipeline import pipeline_evidence as pipeline_evidence
    from ppscope.analysis.pipeline import stage_of_ranks as stage_of_ranks
    from ppscope.analysis.placement import Placement as Placement
    from ppscope.analysis.placement import apply_placement as apply_placement
    from ppscope.analysis.placement import parse_stage_of_rank as parse_stage_of_rank
    from ppscope.analysis.placement import placement_from as placement_from
    from ppscope.analysis.placement import placement_of as placement_of
    from ppscope.analysis.replica_report import lane_ranks as lane_ranks
    from ppscope.analysis.replica_report import replica_json as replica_json
    from ppscope.analysis.replica_report import replica_lines as replica_lines
    from ppscope.analysis.replica_report import stage_lanes as stage_lanes
    from ppscope.analysis.replicas import ReplicaAnalysis as ReplicaAnalysis
    from ppscope.analysis.replicas import StageSpread as StageSpread
    from ppscope.analysis.replicas import analyze_replicas as analyze_replicas
    from ppscope.analysis.replicas import rank_list as rank_list
    from ppscope.analysis.replicas import replica_trace as replica_trace
    from ppscope.analysis.report import incomplete_line as incomplete_line
    from ppscope.analysis.report import print_report as print_report
    from ppscope.analysis.report import replay_line as replay_line
    from ppscope.analysis.report import stdout_console as stdout_console
    from ppscope.analysis.report import write_html as write_html
    from ppscope.analysis.result import CAUSES as CAUSES
    from ppscope.analysis.result import AnalysisResult as AnalysisResult
    from ppscope.analysis.result import Cause as Cause
    from ppscope.analysis.result import HopStats as HopStats
    from ppscope.analysis.result import LatencyStats as LatencyStats
    from ppscope.analysis.result import RequestLatency as RequestLatency
    from ppscope.analysis.result import StageResult as StageResult
    from ppscope.analysis.result import Theory as Theory
    from ppscope.analysis.result import TheoryGap as TheoryGap
    from ppscope.analysis.result import TrainingReplay as TrainingReplay
    from ppscope.analysis.result import WhatIf as WhatIf
    from ppscope.analysis.result import WhatIfCase as WhatIfCase
    from ppscope.analysis.result import WhatIfStraggler as WhatIfStraggler
    from ppscope.analysis.result import WindowInfo as WindowInfo
    from ppscope.analysis.result import json_ns as json_ns
    from ppscope.analysis.sharded import analyze_run as analyze_run
    from ppscope.analysis.sharded_replicas import RunReplicas as RunReplicas
    from ppscope.analysis.sharded_replicas import analyze_run_replicas as analyze_run_replicas
    from ppscope.analysis.sharded_replicas import run_replicas as run_replicas
    from ppscope.analysis.theory import PassCosts as PassCosts
    from ppscope.analysis.theory import decode_bubble as decode_bubble
    from ppscope.analysis.theory import dualpipev_bubble as dualpipev_bubble
    from ppscope.analysis.theory import gpipe_bubble as gpipe_bubble
    from ppscope.analysis.theory import interleaved_bubble as interleaved_bubble
    from ppscope.analysis.theory import theory_for as theory_for
    from ppscope.analysis.theory import zb_h1_bubble as zb_h1_bubble
    from ppscope.analysis.theory import zbv_bubble as zbv_bubble
    from ppscope.analysis.window import parse_window_ms as parse_window_ms

_WHERE = {
    "AnalysisConfig": "analyzer",
    "AnalysisResult": "result",
    "CAUSES": "result",
    "Cause": "result",
    "HopStats": "result",
    "Intervals": "intervals",
    "LatencyStats": "result",
    "NO_SPANS": "analyzer",
    "PassCosts": "theory",
    "Placement": "placement",
    "ROLE_COMPUTE": "bubbles",
    "ROLE_SEND": "bubbles",
    "ROLE_WAIT": "bubbles",
    "ReplicaAnalysis": "replicas",
    "RequestLatency": "result",
    "RunReplicas": "sharded_replicas",
    "StageResult": "result",
    "StageSpread": "replicas",
    "Theory": "result",
    "TheoryGap": "result",
    "TrainingReplay": "result",
    "WhatIf": "result",
    "WhatIfCase": "result",
    "WhatIfStraggler": "result",
    "WindowInfo": "result",
    "analyze": "analyzer",
    "analyze_replicas": "replicas",
    "analyze_run": "sharded",
    "analyze_run_replicas": "sharded_replicas",
    "apply_placement": "placement",
    "covered_within": "intervals",
    "cpu_ranks": "facts",
    "decode_bubble": "theory",
    "dualpipev_bubble": "theory",
    "gpipe_bubble": "theory",
    "incomplete_line": "report",
    "interleaved_bubble": "theory",
    "json_ns": "result",
    "lane_ranks": "replica_report",
    "message_latencies": "pipeline",
    "parse_stage_of_rank": "placement",
    "parse_window_ms": "window",
    "pipeline_evidence": "pipeline",
    "placement_from": "placement",
    "placement_of": "placement",
    "print_report": "report",
    "rank_list": "replicas",
    "replay_line": "report",
    "replica_json": "replica_report",
    "replica_lines": "replica_report",
    "replica_trace": "replicas",
    "request_latency": "latency",
    "run_latency": "analyzer",
    "run_replicas": "sharded_replicas",
    "running_max": "intervals",
    "span_roles": "bubbles",
    "stage_lanes": "replica_report",
    "stage_of_ranks": "pipeline",
    "stdout_console": "report",
    "theory_for": "theory",
    "write_html": "report",
    "zb_h1_bubble": "theory",
    "zbv_bubble": "theory",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

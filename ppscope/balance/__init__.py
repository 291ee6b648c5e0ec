"""Costs and balancing: model shapes, layer costs (profiled or fitted), the exact min-max layer split, and the
capacity planner that sizes memory per stage."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.balance.costs import LayerCosts as LayerCosts
    from ppscope.balance.costs import StageCosts as StageCosts
    from ppscope.balance.costs import parse_ms_list as parse_ms_list
    from ppscope.balance.report import GivenCosts as GivenCosts
    from ppscope.balance.report import ModelSection as ModelSection
    from ppscope.balance.report import RebalanceReport as RebalanceReport
    from ppscope.balance.report import RebalanceRequest as RebalanceRequest
    from ppscope.balance.report import TraceStages as TraceStages
    from ppscope.balance.report import job_kind as job_kind
    from ppscope.balance.report import rebalance_model as rebalance_model
    from ppscope.balance.report import rebalance_runs as rebalance_runs
    from ppscope.balance.split import format_split as format_split
    from ppscope.balance.split import parse_counts as parse_counts
    from ppscope.balance.split import parse_split as parse_split
    from ppscope.balance.split import resolve_split as resolve_split
    from ppscope.balance.split import stage_layer_ranges as stage_layer_ranges
    from ppscope.balance.split import validate_split as validate_split
    from ppscope.balance.split import vllm_default_split as vllm_default_split

_WHERE = {
    "GivenCosts": "report",
    "LayerCosts": "costs",
    "ModelSection": "report",
    "RebalanceReport": "report",
    "RebalanceRequest": "report",
    "StageCosts": "costs",
    "TraceStages": "report",
    "format_split": "split",
    "job_kind": "report",
    "parse_counts": "split",
    "parse_ms_list": "costs",
    "parse_split": "split",
    "rebalance_model": "report",
    "rebalance_runs": "report",
    "resolve_split": "split",
    "stage_layer_ranges": "split",
    "validate_split": "split",
    "vllm_default_split": "split",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

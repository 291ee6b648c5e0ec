"""The options that give layer costs by hand, shared by `ppscope rebalance` and `ppscope simulate`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppscope.balance.report import GivenCosts

__all__ = ["add_cost_arguments", "given_costs"]


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    """The options that give costs without a run."""
    p.add_argument("--layer-costs", metavar="MS,MS,...", help="forward time of each decoder layer, ms")
    p.add_argument("--layers", type=int, help="with --layer-cost-ms: that many layers of equal cost")
    p.add_argument("--layer-cost-ms", type=float, help="with --layers: the cost of every layer, ms")
    p.add_argument("--embed-cost", "--embed-cost-ms", dest="embed_cost", type=float, help="embedding, ms")
    p.add_argument("--head-cost", "--head-cost-ms", dest="head_cost", type=float, help="LM head, ms")
    p.add_argument("--sample-cost", "--sample-cost-ms", dest="sample_cost", type=float, help="sampling, ms")


def given_costs(args: argparse.Namespace) -> GivenCosts:
    """The costs the options give, each None where not given."""
    from ppscope.balance.report import GivenCosts

    return GivenCosts(
        layer_ms=args.layer_costs,
        layers=args.layers,
        each_layer_ms=args.layer_cost_ms,
        embed_ms=args.embed_cost,
        head_ms=args.head_cost,
        sample_ms=args.sample_cost,
    )

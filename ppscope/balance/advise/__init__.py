"""The split search and the advice: the exact min-max layer split, the interval on its predicted speedup, and
the rule that says to keep a split when the gain is noise."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.balance.advise.advice import GIVEN_COSTS as GIVEN_COSTS
    from ppscope.balance.advise.advice import MODELLED_COSTS as MODELLED_COSTS
    from ppscope.balance.advise.advice import SINGLE_TRACE as SINGLE_TRACE
    from ppscope.balance.advise.advice import Advice as Advice
    from ppscope.balance.advise.advice import Interval as Interval
    from ppscope.balance.advise.advice import Part as Part
    from ppscope.balance.advise.advice import Simulated as Simulated
    from ppscope.balance.advise.advice import advise as advise
    from ppscope.balance.advise.advice import paired_throughput_ratio as paired_throughput_ratio
    from ppscope.balance.advise.advice import speedup_interval as speedup_interval
    from ppscope.balance.advise.advice import too_short as too_short
    from ppscope.balance.advise.cores import SharedCores as SharedCores
    from ppscope.balance.advise.cores import run_usage as run_usage
    from ppscope.balance.advise.cores import shared_cores as shared_cores
    from ppscope.balance.advise.problem import BalanceProblem as BalanceProblem
    from ppscope.balance.advise.problem import MemoryModel as MemoryModel
    from ppscope.balance.advise.rebalance import DEEPSPEED_NOTE as DEEPSPEED_NOTE
    from ppscope.balance.advise.rebalance import SERVING_LINES as SERVING_LINES
    from ppscope.balance.advise.rebalance import JobKind as JobKind
    from ppscope.balance.advise.rebalance import Rebalance as Rebalance
    from ppscope.balance.advise.rebalance import balance as balance
    from ppscope.balance.advise.rebalance import engine_lines as engine_lines
    from ppscope.balance.advise.rebalance import evaluate as evaluate

_WHERE = {
    "Advice": "advice",
    "BalanceProblem": "problem",
    "DEEPSPEED_NOTE": "rebalance",
    "GIVEN_COSTS": "advice",
    "Interval": "advice",
    "JobKind": "rebalance",
    "MODELLED_COSTS": "advice",
    "MemoryModel": "problem",
    "Part": "advice",
    "Rebalance": "rebalance",
    "SERVING_LINES": "rebalance",
    "SINGLE_TRACE": "advice",
    "SharedCores": "cores",
    "Simulated": "advice",
    "advise": "advice",
    "balance": "rebalance",
    "engine_lines": "rebalance",
    "evaluate": "rebalance",
    "paired_throughput_ratio": "advice",
    "run_usage": "cores",
    "shared_cores": "cores",
    "speedup_interval": "advice",
    "too_short": "advice",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

"""Layer costs from runs: the timed parts of a run, the fit of its stage spans, its in-situ layer spans, its
per-layer profile, and the choice between them."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.balance.measured.choose import RunCosts as RunCosts
    from ppscope.balance.measured.choose import run_costs as run_costs
    from ppscope.balance.measured.fit import CostFit as CostFit
    from ppscope.balance.measured.fit import fit_layer_costs as fit_layer_costs
    from ppscope.balance.measured.fit import r_squared_text as r_squared_text
    from ppscope.balance.measured.insitu import InSituCosts as InSituCosts
    from ppscope.balance.measured.insitu import insitu_costs as insitu_costs
    from ppscope.balance.measured.profile import PROFILE_FILE as PROFILE_FILE
    from ppscope.balance.measured.profile import LayerProfile as LayerProfile
    from ppscope.balance.measured.profile import PhaseCosts as PhaseCosts
    from ppscope.balance.measured.profile import read_profile as read_profile
    from ppscope.balance.measured.timings import RunTimings as RunTimings
    from ppscope.balance.measured.timings import as_timings as as_timings
    from ppscope.balance.measured.timings import run_timings as run_timings
    from ppscope.balance.measured.training import TRAIN_PASSES as TRAIN_PASSES
    from ppscope.balance.measured.training import is_training as is_training
    from ppscope.balance.measured.training import training_passes as training_passes

_WHERE = {
    "CostFit": "fit",
    "InSituCosts": "insitu",
    "LayerProfile": "profile",
    "PROFILE_FILE": "profile",
    "PhaseCosts": "profile",
    "RunCosts": "choose",
    "RunTimings": "timings",
    "TRAIN_PASSES": "training",
    "as_timings": "timings",
    "fit_layer_costs": "fit",
    "insitu_costs": "insitu",
    "is_training": "training",
    "r_squared_text": "fit",
    "read_profile": "profile",
    "run_costs": "choose",
    "run_timings": "timings",
    "training_passes": "training",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

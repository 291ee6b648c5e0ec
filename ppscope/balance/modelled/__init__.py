"""Layer costs with no run: model shapes and architectures, the GPU table, the roofline, the calibration of
modelled costs on another engine's trace, and the capacity planner."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.balance.modelled.gpus import DEFAULT_GPU as DEFAULT_GPU
    from ppscope.balance.modelled.gpus import GPU as GPU
    from ppscope.balance.modelled.gpus import GPUS as GPUS
    from ppscope.balance.modelled.gpus import gpu_named as gpu_named
    from ppscope.balance.modelled.plan import CapacityPlan as CapacityPlan
    from ppscope.balance.modelled.plan import Cluster as Cluster
    from ppscope.balance.modelled.plan import PlanConfig as PlanConfig
    from ppscope.balance.modelled.plan import StagePlan as StagePlan
    from ppscope.balance.modelled.plan import StepTimes as StepTimes
    from ppscope.balance.modelled.plan import stage_memory_model as stage_memory_model
    from ppscope.balance.modelled.plan import step_times as step_times
    from ppscope.balance.modelled.roofline import ModelCosts as ModelCosts
    from ppscope.balance.modelled.roofline import Workload as Workload
    from ppscope.balance.modelled.roofline import model_costs as model_costs
    from ppscope.balance.modelled.roofline import rate_lines as rate_lines
    from ppscope.balance.modelled.shapes import PRESETS as PRESETS
    from ppscope.balance.modelled.shapes import RENAMED as RENAMED
    from ppscope.balance.modelled.shapes import ModelShape as ModelShape
    from ppscope.balance.modelled.shapes import RopeScaling as RopeScaling
    from ppscope.balance.modelled.shapes import canonical_dtype as canonical_dtype
    from ppscope.balance.modelled.shapes import dtype_bytes as dtype_bytes
    from ppscope.balance.modelled.shapes import renamed_note as renamed_note
    from ppscope.balance.modelled.tracefit import Calibration as Calibration
    from ppscope.balance.modelled.tracefit import calibrate as calibrate

_WHERE = {
    "Calibration": "tracefit",
    "CapacityPlan": "plan",
    "Cluster": "plan",
    "DEFAULT_GPU": "gpus",
    "GPU": "gpus",
    "GPUS": "gpus",
    "ModelCosts": "roofline",
    "ModelShape": "shapes",
    "PRESETS": "shapes",
    "PlanConfig": "plan",
    "RENAMED": "shapes",
    "RopeScaling": "shapes",
    "StagePlan": "plan",
    "StepTimes": "plan",
    "Workload": "roofline",
    "calibrate": "tracefit",
    "canonical_dtype": "shapes",
    "dtype_bytes": "shapes",
    "gpu_named": "gpus",
    "model_costs": "roofline",
    "rate_lines": "roofline",
    "renamed_note": "shapes",
    "stage_memory_model": "plan",
    "step_times": "plan",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

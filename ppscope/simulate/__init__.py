"""Simulation: schedules as data, the discrete-event replay that predicts a run's timeline, and its
calibration on a measured run."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.simulate.advice import replay_both as replay_both
    from ppscope.simulate.advice import replay_interval as replay_interval
    from ppscope.simulate.advice import replay_splits as replay_splits
    from ppscope.simulate.advice import with_replay as with_replay
    from ppscope.simulate.calibrate import Prediction as Prediction
    from ppscope.simulate.calibrate import Replay as Replay
    from ppscope.simulate.calibrate import hop_latency_us as hop_latency_us
    from ppscope.simulate.schedule import ServePolicy as ServePolicy
    from ppscope.simulate.schedule import make_schedule as make_schedule
    from ppscope.simulate.simulator import CommModel as CommModel
    from ppscope.simulate.simulator import SimConfig as SimConfig
    from ppscope.simulate.simulator import simulate as simulate
    from ppscope.simulate.simulator import summarize as summarize
    from ppscope.simulate.simulator import write_run as write_run
    from ppscope.simulate.training import is_training as is_training
    from ppscope.simulate.training import replay_training as replay_training
    from ppscope.simulate.whatif import unread_reason as unread_reason
    from ppscope.simulate.whatif import what_if as what_if

_WHERE = {
    "CommModel": "simulator",
    "Prediction": "calibrate",
    "Replay": "calibrate",
    "ServePolicy": "schedule",
    "SimConfig": "simulator",
    "hop_latency_us": "calibrate",
    "is_training": "training",
    "make_schedule": "schedule",
    "replay_both": "advice",
    "replay_interval": "advice",
    "replay_splits": "advice",
    "replay_training": "training",
    "simulate": "simulator",
    "summarize": "simulator",
    "unread_reason": "whatif",
    "what_if": "whatif",
    "with_replay": "advice",
    "write_run": "simulator",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names

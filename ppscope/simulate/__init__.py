"""Simulation: schedules as data, the discrete-event replay that predicts a run's timeline, and its
calibration on a measured run."""

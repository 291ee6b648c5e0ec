"""Layer costs with no run: model shapes and architectures, the GPU table, the roofline, the calibration of
modelled costs on another engine's trace, and the capacity planner."""

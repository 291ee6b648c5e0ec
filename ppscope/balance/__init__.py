"""Costs and balancing: model shapes, layer costs (profiled or fitted), the exact min-max layer split, and the
capacity planner that sizes memory per stage."""

"""Benchmarks: every figure is a ratio to a reference measured side by side in the same run."""

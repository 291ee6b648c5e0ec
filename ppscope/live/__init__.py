"""Live metrics: a run followed while it is written, its last seconds analysed again and again.

`metrics.py` turns an analysis of a sliding window into metric values (pure: no clock, no files, no server);
`follow.py` polls a run directory (`RunTail`), keeps only what the window needs and re-analyses it. Neither
knows Prometheus: `ppscope watch` and `ppscope run --prometheus-port` (in `ppscope/cli/exporter.py`) serve
the values in its text format.
"""

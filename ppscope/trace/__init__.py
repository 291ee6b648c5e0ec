"""The trace model and the run store: the span schema, the recorder that writes spans, the per-rank SQLite
files a run keeps them in, and the clock offsets that put every rank on one time line."""

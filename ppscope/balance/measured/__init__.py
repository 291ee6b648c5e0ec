"""Layer costs from runs: the timed parts of a run, the fit of its stage spans, its in-situ layer spans, its
per-layer profile, and the choice between them."""

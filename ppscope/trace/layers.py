"""Layer spans name their layer: `layer N`, N the decoder layer in the model's numbering (0-based).

A `layer` span (`SpanKind.LAYER`) times one decoder layer inside a sampled pass; the schema has no column for
a layer index, so the span's name carries it, written by `layer_span_name` and read back by `layer_indices`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["LAYER_PREFIX", "layer_indices", "layer_span_name"]

LAYER_PREFIX = "layer "


def layer_span_name(index: int) -> str:
    """The name of the `layer` span of decoder layer `index` (0-based, the model's numbering): `layer 7`. The
    name is where a `layer` span carries its layer; `layer_indices` reads it back."""
    return f"{LAYER_PREFIX}{index}"


def layer_indices(names: pd.Series) -> pd.Series:
    """The decoder-layer index of each `layer` span from its name (`layer 7` -> 7); -1 where a name is not one."""
    text = names.astype(str)
    digits = text.str.removeprefix(LAYER_PREFIX)
    good = text.str.startswith(LAYER_PREFIX) & digits.str.fullmatch(r"\d{1,9}")
    return pd.Series(np.where(good, pd.to_numeric(digits.where(good, "-1")), -1), index=names.index, dtype=np.int64)

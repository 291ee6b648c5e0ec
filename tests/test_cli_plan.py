"""`ppscope plan` as printed: one unit per quantity, and figures that add up."""

from __future__ import annotations

import json

import pytest

from ppscope.cli.main import main


def test_each_stage_adds_up_to_the_usable_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """Layer weights + extra + KV + reserve is the usable memory of a GPU: the extra is not counted twice."""
    assert main(["plan", "--model", "llama3-70b", "--gpus", "8", "--pp", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for s in d["stages"]:
        parts = s["layer_weights_bytes"] + s["extra_bytes"] + s["kv_bytes"] + d["reserve_bytes_per_gpu"]
        assert parts == d["usable_bytes_per_gpu"]
        assert s["weights_bytes"] == s["layer_weights_bytes"] + s["extra_bytes"]
    assert main(["plan", "--model", "llama3-70b", "--gpus", "8", "--pp", "2"]) == 0
    text = capsys.readouterr().out
    assert "weights per GPU, layers + extra: 65.71, 65.83 GiB" in text and "hold 131.54 GiB)" in text

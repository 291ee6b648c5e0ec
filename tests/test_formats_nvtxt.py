"""NVTXT export: one file per rank; what we write reads back as the same ranges (best effort format)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_formats_helpers import make_run

from ppscope.errors import RunExistsError
from ppscope.formats.nsys_export import ppscope_message
from ppscope.formats.nvtxt import NVTXT_NOTE, export_nvtxt, read_nvtxt
from ppscope.store import load_run


def test_one_file_per_rank_with_every_span(tmp_path: Path) -> None:
    trace = load_run(make_run(tmp_path / "run"))
    files = export_nvtxt(trace, tmp_path / "nvtxt")
    assert [f.name for f in files] == ["rank-0.nvtxt", "rank-1.nvtxt", "rank-2.nvtxt"]
    for rank, f in enumerate(files):
        text = f.read_text()
        assert NVTXT_NOTE in text and f'SetFileDisplayName, "ppscope rank {rank} / stage {rank}"' in text
        got = sorted((s, e, m) for _, s, e, m in read_nvtxt(f))
        spans = trace.spans[trace.spans["rank"] == rank]
        want = sorted(
            (int(r.start_ns), int(r.end_ns), ppscope_message(int(r.stage), str(r.kind), int(r.mb), int(r.chunk)))
            for r in spans.itertuples()
        )
        assert got == want
        threads = {t for t, *_ in read_nvtxt(f)}
        assert len(threads) == spans["lane"].nunique()


def test_refuses_a_non_empty_directory_without_force(tmp_path: Path) -> None:
    trace = load_run(make_run(tmp_path / "run"))
    out = tmp_path / "nvtxt"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(RunExistsError, match="--force"):
        export_nvtxt(trace, out)
    assert (out / "mine.txt").read_text() == "keep"
    export_nvtxt(trace, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.nvtxt", "rank-1.nvtxt", "rank-2.nvtxt"]

"""NVTXT export: one file per rank; what we write reads back as the same ranges (best effort format)."""

from __future__ import annotations

from pathlib import Path

from error_helpers import raises_code
from test_formats_helpers import make_run

from ppscope.errors import ErrorCode, RunExistsError
from ppscope.formats.nvtxt import NVTXT_NOTE, export_nvtxt, nvtxt_message, read_nvtxt
from ppscope.trace.store import load_run


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
            (int(r.start_ns), int(r.end_ns), nvtxt_message(r.kind, r.name, r.stage, r.mb, r.chunk))
            for r in spans.itertuples()
        )
        assert got == want
        threads = {t for t, *_ in read_nvtxt(f)}
        assert len(threads) == spans["lane"].nunique()


def test_refuses_a_non_empty_directory_without_force(tmp_path: Path) -> None:
    """--force replaces an earlier export; a folder holding anything else is never emptied, even with it."""
    trace = load_run(make_run(tmp_path / "run"))
    out = tmp_path / "nvtxt"
    out.mkdir()
    (out / "rank-0.nvtxt").write_text("an earlier export")
    with raises_code(RunExistsError, ErrorCode.RUN_EXISTS):
        export_nvtxt(trace, out)
    assert (out / "rank-0.nvtxt").read_text() == "an earlier export"
    export_nvtxt(trace, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.nvtxt", "rank-1.nvtxt", "rank-2.nvtxt"]
    (out / "mine.txt").write_text("keep")
    with raises_code(RunExistsError, ErrorCode.OUTPUT_HOLDS_OTHER_FILES):
        export_nvtxt(trace, out, force=True)
    assert (out / "mine.txt").read_text() == "keep" and len(list(out.iterdir())) == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_imported_spans_keep_their_names(tmp_path: Path) -> None:
    from ppscope.trace.model import Trace

    trace = Trace.from_records(
        [
            {
                "rank": 0,
                "stage": 0,
                "kind": "kernel",
                "name": 'gemm<"f16">',
                "lane": "stream 7",
                "start_ns": 5,
                "end_ns": 9,
            },
            {"rank": 0, "stage": 0, "kind": "forward", "mb": 2, "start_ns": 10, "end_ns": 20},
        ]
    )
    (f,) = export_nvtxt(trace, tmp_path / "n")
    assert sorted(m for *_, m in read_nvtxt(f)) == ['gemm<"f16">', "s0 forward mb2"]

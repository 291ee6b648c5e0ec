"""A rank's failure in words, and what a run's readers say about the failures its ranks recorded: by the code
each rank recorded, or by the text rule for rank files of older versions, which recorded none."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ppscope.analysis import analyze
from ppscope.failures import FailureCode, RankError, plain_error, rank_failure, recorded_failures
from ppscope.trace.model import RunMeta
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.store import RankWriter, create_run, load_run, rank_file

OWN = "RuntimeError: injected failure after 1 passes"
ECHO = "RuntimeError: rank 2: receive from rank 1 failed: Connection closed by peer [127.0.0.1]:47258"
PEER, SELF = FailureCode.PEER, FailureCode.OWN


def test_a_rank_error_reads_without_the_library_source_location_advice_or_backtrace() -> None:
    seen = RuntimeError(  # a rank whose successor was killed, as this torch's gloo said it
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:20096: "
        "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. "
        "Check the logs of the remote worker before reporting an error. GLHF! \N{UMBRELLA ON GROUND}"
    )
    assert plain_error(seen) == "RuntimeError: Read error [127.0.0.1]:20096: Connection reset by peer"
    wrapped = RuntimeError(  # the ring's own words around gloo's
        "rank 1: receive from rank 0 failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:14008. This is typically caused by a remote worker crashing. GLHF!"
    )
    assert plain_error(wrapped) == (
        "RuntimeError: rank 1: receive from rank 0 failed: Connection closed by peer [127.0.0.1]:14008"
    )
    store = TimeoutError("timed out\nException raised from throwTimeoutError at /x/socket.cpp:1030 (most recent call")
    assert plain_error(store) == "TimeoutError: timed out"
    assert plain_error(KeyError("layers.3.w")) == "KeyError: 'layers.3.w'"
    assert plain_error(RuntimeError()) == "RuntimeError"


def test_recorded_failures_name_the_cause_before_its_echoes() -> None:
    assert recorded_failures({2: RankError(ECHO, PEER), 1: RankError(OWN, SELF)}) == [
        f"rank 1 failed: {OWN}",
        "1 rank(s) then lost their link to a failed one",
    ]
    # the cause recorded nothing (killed): the echo, saying its rank once
    assert recorded_failures({2: RankError(ECHO, PEER)}) == [
        "rank 2 failed: RuntimeError: receive from rank 1 failed: Connection closed by peer [127.0.0.1]:47258"
    ]
    own = RankError(OWN, SELF)
    assert recorded_failures({0: own}, said=f"rank 0: {OWN}") == []  # the run's status says it already
    assert recorded_failures({0: own, 3: own}, said=f"rank 0: {OWN}") == [f"rank 3 failed: {OWN}"]  # not rank 3's
    assert recorded_failures({}) == []
    many = recorded_failures({r: RankError(ECHO.replace("rank 2", f"rank {r}"), PEER) for r in range(6)})
    assert len(many) == 4 and many[0].startswith("rank 0 failed: ") and many[3] == "3 more rank(s) recorded a failure"


def test_a_rank_saying_its_own_failure_names_itself_once_and_calls_a_broken_link_an_echo() -> None:
    own = rank_failure(1, RuntimeError("injected failure after 1 passes"), SELF)
    assert own == "rank 1 failed: RuntimeError: injected failure after 1 passes"
    link = RuntimeError("rank 2: receive from rank 1 failed: Connection closed by peer [::1]:5")
    echo = rank_failure(2, link, PEER)
    assert echo == (
        "rank 2 failed: RuntimeError: receive from rank 1 failed: Connection closed by peer [::1]:5 "
        "(most likely an echo: the rank that failed first names the cause)"
    )


def test_the_recorded_code_decides_and_the_text_only_without_one() -> None:
    """A code says whose failure it is whatever the words; a rank file of an older version recorded only the
    words, and the text rule reads them."""
    assert RankError(ECHO, SELF).peer is False and RankError(OWN, PEER).peer is True
    assert recorded_failures({1: RankError(ECHO, SELF), 2: RankError(OWN, PEER)}) == [
        f"rank 1 failed: {ECHO.replace(': rank 1: ', ': ')}",
        "1 rank(s) then lost their link to a failed one",
    ]
    assert RankError(ECHO).peer is True and RankError(OWN).peer is False  # older files: by the text


def test_an_error_whose_message_cannot_be_made_is_named_by_its_type() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    assert plain_error(Unprintable()) == "Unprintable"


def test_a_failure_a_rank_recorded_is_a_warning_of_the_run(tmp_path: Path) -> None:
    """Under torchrun each failing rank records its own error; rank 0 writes the run's status, and when torchrun
    stops it that status says only 'stopped by SIGTERM'."""
    meta = RunMeta(
        source="ppscope",
        world_size=3,
        pp_size=3,
        schedule="gpipe",
        status="interrupted",
        error="rank 0: stopped by SIGTERM",
    )
    run = create_run(tmp_path / "run", meta)
    for rank, error, code in ((0, None, None), (1, OWN, SELF), (2, ECHO, PEER)):
        w = RankWriter(run, rank)
        if error:
            w.set_info("error", error)
            w.set_info("failure_code", str(code))
        w.close()
    trace = load_run(run)
    failed = Notice(NoticeCode.RANK_FAILED, f"rank 1 failed: {OWN}")
    assert failed in trace.warnings
    assert failed in analyze(trace).warnings
    echo = Notice(NoticeCode.RANK_FAILED, "1 rank(s) then lost their link to a failed one")
    assert echo in trace.warnings


def test_a_rank_file_of_an_older_version_without_a_code_is_read_by_its_text(tmp_path: Path) -> None:
    run = create_run(tmp_path / "run", RunMeta(source="ppscope", world_size=2, status="interrupted"))
    for rank, error in ((0, ECHO.replace("rank 2", "rank 0")), (1, OWN)):
        w = RankWriter(run, rank)
        w.set_info("error", error)  # as ppscope wrote it before ranks recorded a failure_code
        w.close()
    failed = [n.text for n in load_run(run).warnings if n.code == NoticeCode.RANK_FAILED]
    assert failed == [f"rank 1 failed: {OWN}", "1 rank(s) then lost their link to a failed one"]


def test_a_recorded_error_that_cannot_be_read_is_said_so_and_the_spans_still_load(tmp_path: Path) -> None:
    run = create_run(tmp_path / "run", RunMeta(source="ppscope", world_size=2, status="interrupted"))
    for rank in range(2):
        RankWriter(run, rank).close()
    with sqlite3.connect(rank_file(run, 1)) as db:  # not JSON, not UTF-8
        db.execute("INSERT INTO info VALUES ('error', CAST(x'ff00fe' AS TEXT))")
    with sqlite3.connect(rank_file(run, 0)) as db:  # nested past any parser's depth, and long
        db.execute("INSERT INTO info VALUES ('error', ?)", ("[" * 100_000,))
    said = load_run(run).warnings
    failed = [n.text for n in said if n.code == NoticeCode.RANK_FAILED]
    assert "rank 1 failed: (its recorded error cannot be read: the file is damaged)" in failed, said
    assert any(text.startswith("rank 0 failed: [[[[") and len(text) < 600 for text in failed), said

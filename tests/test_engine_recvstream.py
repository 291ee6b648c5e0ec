"""A GPU ring's payload receives on a stream of their own, driven with stand-ins for torch.cuda's streams and
events on a CPU: which stream is current when each thing is posted, waited for and kept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ppscope.engine.recvstream import ReceiveStream


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeCuda:
    """The parts of torch.cuda that ReceiveStream uses; `log` says what happened on which stream."""

    def __init__(self) -> None:
        self.compute = FakeStream("compute")
        self.current = self.compute
        self.log: list[tuple[str, str]] = []

    def Stream(self, device: torch.device) -> FakeStream:
        return FakeStream("receive")

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        before, self.current = self.current, s
        try:
            yield
        finally:
            self.current = before

    def Event(self) -> Any:
        cuda = self

        class Event:
            def record(self, stream: FakeStream) -> None:
                cuda.log.append(("event recorded", stream.name))

            def synchronize(self) -> None:
                cuda.log.append(("host waits for the event", cuda.current.name))

        return Event()


class FakeWork:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def wait(self) -> None:  # NCCL's Work.wait(): the current stream waits for the transfer
        self.cuda.log.append(("stream waits for the receive", self.cuda.current.name))


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: fake.log.append(("buffer kept for", s.name)))
    return fake


def _posted(cuda: FakeCuda, receiver: ReceiveStream, data: torch.Tensor) -> tuple[torch.Tensor, FakeWork]:
    def irecv(buf: torch.Tensor) -> FakeWork:
        cuda.log.append(("receive posted", cuda.current.name))
        buf.copy_(data)  # the transfer
        return FakeWork(cuda)

    return receiver.post(list(data.shape), data.dtype, irecv)


def test_an_activation_is_received_beside_the_compute_and_waited_for_by_the_compute_stream(cuda: FakeCuda) -> None:
    receiver = ReceiveStream(torch.device("cpu"), cuda, pin=False)
    data = torch.randn(3, 4)
    buf, work = _posted(cuda, receiver, data)
    assert cuda.current is cuda.compute  # the receive stream was current only while posting
    receiver.to_compute(buf, work, lambda w: w.wait())
    assert torch.equal(buf, data)
    assert cuda.log == [
        ("receive posted", "receive"),  # NCCL's stream waits for the idle receive stream, not the queued passes
        ("stream waits for the receive", "compute"),  # the compute stream waits, not the host
        ("buffer kept for", "compute"),  # its memory is not reused before the pass that reads it has run
    ]


def test_tokens_come_to_the_host_after_their_own_copy_not_the_compute_queue(cuda: FakeCuda) -> None:
    receiver = ReceiveStream(torch.device("cpu"), cuda, pin=False)
    data = torch.tensor([5, 9, 2])
    buf, work = _posted(cuda, receiver, data)
    host = receiver.to_host(buf, work, lambda w: w.wait())
    assert host.device.type == "cpu" and host.tolist() == [5, 9, 2]
    assert cuda.log == [
        ("receive posted", "receive"),
        ("stream waits for the receive", "receive"),  # the copy waits for the transfer on the receive stream
        ("event recorded", "receive"),  # after the copy to host memory
        ("host waits for the event", "compute"),  # the host waits for that copy alone
    ]
    assert all(name != "compute" for what, name in cuda.log if what != "host waits for the event")

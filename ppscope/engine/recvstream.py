"""Receiving a payload on a GPU without waiting for the rank's own queued compute.

torch's NCCL point-to-point makes NCCL's stream wait for the stream that is current when an operation is
posted. A receive posted while the compute stream is current would start its transfer only once every pass
queued before it had run, so message m could not arrive while the rank still computes m-1. So a GPU ring
receives its payloads under a stream of its own (`ReceiveStream`): the buffer is allocated there (the caching
allocator then hands out only memory whose earlier uses, recorded on that stream, are done) and the receive
is posted there, so the transfer starts at once, beside the queued compute. Then:

- an activation: the compute stream waits for the receive just before the pass that uses it (`Work.wait()`
  makes the current stream wait, not the host), and `record_stream` tells the allocator that the compute
  stream uses the buffer, so its memory is not reused before that pass has run;
- tokens (rank 0): they are copied to pinned host memory on the receive stream, and the host waits for that
  copy's event alone, not for the passes queued on the compute stream (as a `.tolist()` of the device tensor
  would).

This module needs torch.cuda only through the object it is given, so tests drive it with stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["ReceiveStream"]


class ReceiveStream:
    """Payload receives of one rank's GPU ring, on a stream of their own. Use from the compute thread, with
    the compute stream current (as it is when the ring is made and used)."""

    def __init__(self, device: torch.device, cuda: Any = torch.cuda, *, pin: bool = True) -> None:
        self.device = device
        self.cuda = cuda
        self.stream = cuda.Stream(device)
        self.compute = cuda.current_stream(device)
        self.pin = pin
        """Tokens come to page-locked host memory (a copy from the device to pageable memory is synchronous)."""

    def post(
        self, shape: Sequence[int], dtype: torch.dtype, irecv: Callable[[torch.Tensor], Any]
    ) -> tuple[torch.Tensor, Any]:
        """A buffer allocated on the receive stream and `irecv(buffer)` posted there: (buffer, work)."""
        with self.cuda.stream(self.stream):
            buf = torch.empty(tuple(shape), dtype=dtype, device=self.device)
            return buf, irecv(buf)

    def to_compute(self, buf: torch.Tensor, work: Any, wait: Callable[[Any], None]) -> None:
        """The compute stream waits for the receive before what is queued on it next (`wait(work)`, with the
        compute stream current), and the buffer's memory is kept until the compute stream is done with it."""
        wait(work)
        buf.record_stream(self.compute)

    def to_host(self, buf: torch.Tensor, work: Any, wait: Callable[[Any], None]) -> torch.Tensor:
        """The received tensor in host memory: the receive stream waits for the receive and copies, the host
        waits for that copy alone."""
        with self.cuda.stream(self.stream):
            wait(work)
            host = torch.empty(tuple(buf.shape), dtype=buf.dtype, pin_memory=self.pin)
            host.copy_(buf, non_blocking=True)
            copied = self.cuda.Event()
            copied.record(self.stream)
        copied.synchronize()
        return host

"""The ring: rank r receives only from r-1 and sends only to r+1 (the last rank sends sampled tokens to rank 0).

How messages, posted-ahead receives, the send reaper and the GPU's gloo headers beside NCCL payloads work, and
why: docs/ARCHITECTURE.md, "The ring". This module knows nothing about models or schedules.
"""

from __future__ import annotations

import collections
import enum
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ppscope.engine.model import Batch, to_device
from ppscope.engine.recvstream import ReceiveStream
from ppscope.failures import FailureCode
from ppscope.trace.model import Phase, SpanKind
from ppscope.trace.recorder import Recorder

__all__ = [
    "ACT",
    "MAX_DEPTH",
    "MAX_INLINE_NBYTES",
    "PING",
    "REAP_S",
    "STOP",
    "TOKENS",
    "Message",
    "PeerLinkError",
    "PeerTimeout",
    "Ring",
    "WaitFailure",
    "failure_code",
    "silent_peer",
    "wait_failure",
]

ACT, TOKENS, STOP, PING = 1, 2, 3, 4
"""Message kinds. PING carries nothing and goes once round the ring: rank 0 sends it while it waits for
requests to arrive, so the others, who wait for it at most the link's timeout, know it is alive."""
_FIXED = 8
_INLINE = 1 << 8  # flag in the dtype word: the payload travels inside the header
MAX_INLINE_NBYTES = 1 << 20
"""The largest payload that rides in its header (the receive posted ahead has room for it); larger ones
follow in a second message, whose receive is posted only when the header has said its size."""
MAX_DEPTH = 16
"""At most this many header receives posted ahead (each has room for MAX_INLINE_NBYTES)."""
REAP_S = 0.02
"""How often the reaper thread waits for the completion of the sends posted since it last looked."""
_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]
_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.bfloat16: np.int16,
    torch.float16: np.float16,
    torch.int64: np.int64,
}
"""How an inline payload of each dtype is read out of the header (bfloat16 as its bits)."""


class PeerTimeout(TimeoutError):
    """Nothing arrived from `peer` within the timeout: that peer failed or hangs."""

    def __init__(self, message: str, *, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class PeerLinkError(RuntimeError):
    """A send to or receive from `peer` failed: the link broke under this rank (the peer's process died, its
    socket closed), so the failure is most likely that peer's."""

    def __init__(self, message: str, *, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from, or while handling, once each."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def silent_peer(exc: BaseException) -> int | None:
    """The peer a rank timed out waiting for, if `exc` is (or was raised from) a PeerTimeout."""
    return next((cur.peer for cur in _chain(exc) if isinstance(cur, PeerTimeout)), None)


_DIST_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(dist, name) for name in ("DistNetworkError", "DistBackendError", "DistStoreError") if hasattr(dist, name)
)
"""torch.distributed's errors of a broken process group, its store or its network."""
_LINK_BROKEN = re.compile(r"by peer|broken pipe|timed out|remote process", re.IGNORECASE)
"""gloo's words for a connection that broke or a wait that timed out, in a plain RuntimeError."""


def failure_code(exc: BaseException) -> FailureCode:
    """Whose failure a rank's error is, decided by the failing rank for its rank file and the launcher: PEER when
    its link or process group broke under it (a PeerTimeout, the ring's own error for a send or receive that
    failed (PeerLinkError), or a torch.distributed DistNetworkError, DistBackendError or DistStoreError anywhere
    in its chain), else OWN. Beside `wait_failure`, the one other place that reads a
    library's text: gloo raises a connection closed or reset by its peer as a plain RuntimeError, whose words are
    its only sign, so they are read here, once, and everything downstream goes by the code."""
    for cur in _chain(exc):
        if isinstance(cur, (PeerTimeout, PeerLinkError, *_DIST_ERRORS)):
            return FailureCode.PEER
        if type(cur) is RuntimeError and _LINK_BROKEN.search(str(cur)):
            return FailureCode.PEER
    return FailureCode.OWN


class WaitFailure(enum.Enum):
    """How a wait on a torch.distributed receive failed."""

    TIMEOUT = "timeout"
    """Nothing arrived within the process group's timeout: the peer failed or hangs."""
    BROKEN = "broken"
    """The link broke (the peer's process died, its socket closed) or the backend failed otherwise."""


def wait_failure(exc: BaseException) -> WaitFailure:
    """Which failure a receive's `wait()` raised. The one place ppscope reads an exception's text to tell cases
    apart: torch and gloo raise a timed-out wait as a RuntimeError (a DistBackendError at best, which a broken
    link raises too), whose only sign of the timeout is its message ("Timed out waiting 30000ms for recv
    operation to complete"). So it is read here, once, and everything else goes by the code."""
    return WaitFailure.TIMEOUT if "timed out" in str(exc).lower() else WaitFailure.BROKEN


@dataclass
class Message:
    kind: int
    mb: int = -1
    step: int = -1
    stage: int = -1
    """ACT: the virtual stage that consumes it; TOKENS: the virtual stage that produced them."""
    batch: Batch | None = None
    payload: torch.Tensor | None = None

    @property
    def phase(self) -> str:
        if self.batch is not None:
            return self.batch.phase
        return Phase.PREFILL if self.step == 0 else Phase.DECODE


class Ring:
    """Point-to-point links of one rank. With one rank, messages go straight to its own queue."""

    def __init__(
        self,
        rank: int,
        world: int,
        recorder: Recorder,
        max_seqs: int,
        device: torch.device,
        timeout_s: float,
        inline_nbytes: int = 0,
        depth: int = 1,
        host_headers: bool = False,
        compute: torch.device | None = None,
    ) -> None:
        self.rank, self.world = rank, world
        self.prev, self.next = (rank - 1) % world, (rank + 1) % world
        self.rec = recorder
        self.max_seqs = max_seqs
        self.device = device
        self.cuda = device.type == "cuda"
        self.compute = compute if compute is not None and compute != device else None
        """Where the stage computes when it is not where messages travel (gloo between GPUs): activations are
        copied off it inside the send span and onto it inside the receive span, through host memory."""
        self.host_headers = host_headers or self.cuda or self.compute is not None
        """Headers on CPU groups of their own, payloads on the device's groups (always on a GPU; on a CPU,
        tests use it to run that protocol over gloo)."""
        wanted = min(max(inline_nbytes, 8 * max_seqs), MAX_INLINE_NBYTES) if not self.host_headers else 0
        self.inline_nbytes = -(-wanted // 8) * 8
        """Payloads up to this size ride in the header: one message per hop instead of two (not when headers
        have groups of their own). A gloo receive may be larger than what arrives, so each header is sent at
        its own length, while the receive posted ahead has room for the largest."""
        self.timeout_s = timeout_s
        self._local: collections.deque[Message] = collections.deque()
        self._sent: collections.deque[_Posted] = collections.deque()
        self._closing = threading.Event()
        self._reaper: threading.Thread | None = None
        self._groups: tuple[Any, Any] = (None, None)
        self._header_groups: tuple[Any, Any] = (None, None)
        self.depth = min(max(depth, 1), MAX_DEPTH)
        """Header receives kept posted: as many as messages may queue here, so none waits for a receive to
        be posted (gloo moves a message only once its receive is posted: a round trip)."""
        self._payload_tag = 0 if self.host_headers else 1
        """Separate payloads travel under their own tag when headers share their group, so the headers
        posted ahead never take them (NCCL has no tags; there headers have groups of their own)."""
        self.device_spans: Any = None
        """On a GPU, the compute stream's wait for a payload is timed on the device (ppscope.engine.gputime)."""
        self._posted: collections.deque[tuple[torch.Tensor, Any]] = collections.deque()
        """Receives of the next headers (buffer, work), in arrival order, posted ahead to land while the
        rank computes."""
        self._spare: list[torch.Tensor] = []
        self._receiver: ReceiveStream | None = None
        """On a GPU, payloads are received on a stream of their own (ppscope.engine.recvstream)."""
        self._waiter: _Waiter | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        if self.world == 1:
            return
        if self.cuda:
            self._receiver = ReceiveStream(self.device)
        self._groups = self._header_groups = self._link_groups(None)
        if self.host_headers:
            self._header_groups = self._link_groups("gloo")
        self._warm_links()
        self._reaper = threading.Thread(target=self._reap_loop, name=f"ppscope-send-r{self.rank}", daemon=True)
        self._reaper.start()
        for _ in range(self.depth):
            self._post_header()

    def _warm_links(self) -> None:
        """One tiny payload round the ring before the run's clock starts: NCCL makes a pair's communicator at
        its first send and receive (hundreds of ms), which would otherwise land in the first pass's hop."""
        out, into = torch.zeros(1, device=self.device), torch.empty(1, device=self.device)
        tag = self._payload_tag

        def receive() -> None:
            dist.recv(into, src=self.prev, group=self._group(self.prev), tag=tag)

        # Rank 0 sends first and every other rank receives first, so whatever setup a pair's first transfer
        # blocks on, its peer is already there: the round cannot wait on itself.
        if self.rank != 0:
            receive()
        sent = dist.isend(out, dst=self.next, group=self._group(self.rank), tag=tag)
        if self.rank == 0:
            receive()
        if sent is not None:  # None only for a rank outside the group, which a ring rank never is
            sent.wait()

    def _link_groups(self, backend: str | None) -> tuple[Any, Any]:
        """(incoming, outgoing): the two-rank process groups of the links prev -> rank and rank -> next.

        Each link has a group of its own, so no two links share a communicator whatever torch does with a
        group's point-to-point operations (a middle rank's receive never queues behind its send; with two
        ranks, neither direction behind the other). new_group is collective: every rank creates every
        link's group, in the same order."""
        links = [dist.new_group([r, (r + 1) % self.world], backend=backend) for r in range(self.world)]
        return links[self.prev], links[self.rank]

    def _group(self, src: int, header: bool = False) -> Any:
        """The group of the link from `src`: the incoming one, or the outgoing one when `src` is this rank."""
        groups = self._header_groups if header else self._groups
        return groups[1] if src == self.rank else groups[0]

    # ------------------------------------------------------------ compute-thread side

    def send(self, msg: Message) -> None:
        if self.world == 1:
            self._local.append(msg)
            return
        if self.error is not None:
            raise PeerLinkError(
                f"rank {self.rank}: send to rank {self.next} failed: {self.error}", peer=self.next
            ) from self.error
        # Post the sends here (they return at once) so no thread hop sits on the critical path; the reaper
        # thread waits for their completion, keeping the tensors alive until then.
        start = self.rec.now_ns()
        header, payload = self._pack(msg)
        src_stage = msg.stage - 1 if msg.kind == ACT else msg.stage
        fields: dict[str, Any] = dict(
            mb=msg.mb,
            step=msg.step,
            phase=msg.phase,
            stage=src_stage,
            chunk=max(src_stage, 0) // self.world,
            peer=self.next,
            nbytes=_nbytes(msg.payload),
        )
        if msg.kind in (STOP, PING):
            works = self._post(header, payload)
        elif self.device_timed:
            # on the compute stream the span marks where the payload is ready: NCCL's stream waits for it there
            with self.device_spans.span(SpanKind.SEND, **fields):
                works = self._post(header, self._to_host(payload))
        else:
            with self.rec.nvtx_range(SpanKind.SEND, stage=src_stage, mb=msg.mb, chunk=fields["chunk"]):
                works = self._post(header, self._to_host(payload))
            # The stage is blocked only while posting: the successor always has a receive posted, so a send
            # never waits for it. The transfer shows as the receiver's `recv` span.
            self.rec.record(SpanKind.SEND, start, self.rec.now_ns(), **fields)
        device_work = works[-1] if self.cuda and payload is not None else None
        self._sent.append(_Posted(works, (header, payload), device_work))  # no wake-up: the reaper looks every REAP_S

    def _post(self, header: torch.Tensor, payload: torch.Tensor | None) -> list[Any]:
        works = [dist.isend(header, dst=self.next, group=self._group(self.rank, header=True))]
        if payload is not None:
            works.append(dist.isend(payload, dst=self.next, group=self._group(self.rank), tag=self._payload_tag))
        return works

    def _to_host(self, payload: torch.Tensor | None) -> torch.Tensor | None:
        """A payload where gloo can send it: copied off the stage's GPU when messages go through host memory."""
        return payload.cpu() if payload is not None and self.compute is not None else payload

    @property
    def device_timed(self) -> bool:
        """Send and receive spans are timed on the compute stream (set on a GPU when recording): see `_take`."""
        return self.device_spans is not None

    def get(self) -> Message:
        """The next message from the predecessor; raises if the link failed or nothing came within the timeout."""
        if self.world == 1:
            if not self._local:
                raise RuntimeError("rank 0 waits for a message that nobody sent (a schedule bug)")
            return self._local.popleft()
        msg = self._take(None)
        assert msg is not None
        return msg

    def poll(self, timeout_s: float) -> Message | None:
        """The next message if one arrives within `timeout_s`, else None."""
        if self.world == 1:
            if self._local:
                return self._local.popleft()
            time.sleep(max(timeout_s, 0.0))  # a single rank has nobody else to hear from
            return None
        return self._take(max(timeout_s, 0.0))

    def close(self) -> None:
        self._closing.set()
        if self._reaper is not None:
            self._reaper.join(timeout=self.timeout_s)
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------ receiving, on the compute thread

    def _post_header(self) -> None:
        # buffers are reused: a message is parsed (copied out) before its buffer is posted again
        buf = self._spare.pop() if self._spare else None
        if buf is None:
            buf = torch.empty(self._meta_words() + self.inline_nbytes // 8, dtype=torch.int64)
        self._posted.append((buf, dist.irecv(buf, src=self.prev, group=self._group(self.prev, header=True))))

    def _take(self, timeout_s: float | None) -> Message | None:
        """The next message. The compute thread waits on the posted receive itself (no thread hop) unless it
        must give up after `timeout_s` shorter than the link's timeout: then a waiter thread waits for it."""
        if not self._posted:
            raise RuntimeError(f"rank {self.rank} waits for rank {self.prev} after the ring stopped (a schedule bug)")
        waited_from = self.rec.now_ns()
        buf, posted = self._posted[0]
        if timeout_s is not None and timeout_s >= self.timeout_s:
            timeout_s = None  # the process group's own timeout applies
        if timeout_s is None and self._waiter is None:
            self._wait(posted)
        else:
            if self._waiter is None:
                self._waiter = _Waiter(posted)
            if not self._waiter.done.wait(self.timeout_s if timeout_s is None else timeout_s):
                if timeout_s is None:
                    raise self._timeout()
                return None
            waiter, self._waiter = self._waiter, None
            if waiter.error is not None:
                raise self._failed(waiter.error) from waiter.error
        msg, shape, dtype = self._parse(buf)
        self._posted.popleft()
        self._spare.append(buf)
        if shape is None:
            if msg.kind != STOP:
                self._post_header()
            return msg
        start = self.rec.now_ns()
        payload, work = self._post_payload(shape, dtype)
        if msg.kind != STOP:
            self._post_header()
        stage = self._consumer_stage(msg)
        fields: dict[str, Any] = dict(
            mb=msg.mb,
            step=msg.step,
            phase=msg.phase,
            stage=stage,
            chunk=stage // self.world,
            peer=self.prev,
            nbytes=payload.numel() * payload.element_size(),
        )
        if self._receiver is not None and msg.kind == TOKENS:
            # Rank 0 reads tokens on the host: copied to pinned memory on the receive stream, the host waits
            # for that copy alone, not for the passes queued on its compute stream; a host-timed wait.
            with self.rec.nvtx_range(SpanKind.RECV_WAIT, stage=stage, mb=msg.mb, chunk=fields["chunk"]):
                payload = self._receiver.to_host(payload, work, self._wait)
            self.rec.record(SpanKind.RECV_WAIT, waited_from, self.rec.now_ns(), **fields)
        elif self.device_timed:
            # The stream waits for the payload, the host does not. The span runs from when the host began
            # waiting for the header to when the stream has the payload: the stage waiting for its input,
            # transfer included, as a CPU's recv_wait with the payload in its header. Where the device was
            # still computing meanwhile, its compute spans take precedence in the analysis.
            with self.device_spans.span(SpanKind.RECV_WAIT, since_ns=waited_from, **fields):
                payload = self._arrive(payload, work, msg.kind)
        else:
            with self.rec.nvtx_range(SpanKind.RECV, stage=stage, mb=msg.mb, chunk=fields["chunk"]):
                payload = self._arrive(payload, work, msg.kind)
            self.rec.record(SpanKind.RECV, start, self.rec.now_ns(), **fields)
        msg.payload = payload
        return msg

    def _post_payload(self, shape: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
        """A payload's buffer and its posted receive: on a GPU on the receive stream, so that the transfer
        does not wait for the passes queued on the compute stream."""

        def irecv(buf: torch.Tensor) -> Any:
            return dist.irecv(buf, src=self.prev, group=self._group(self.prev), tag=self._payload_tag)

        if self._receiver is not None:
            return self._receiver.post(shape, dtype, irecv)
        payload = torch.empty(shape, dtype=dtype, device=self.device)
        return payload, irecv(payload)

    def _arrive(self, payload: torch.Tensor, work: Any, kind: int) -> torch.Tensor:
        """Wait for a payload: the host on a CPU; the compute stream on a GPU, which then keeps the buffer.
        Activations for a stage computing elsewhere (`compute`) are then copied there; tokens stay on the host."""
        if self._receiver is not None:
            self._receiver.to_compute(payload, work, self._wait)
        else:
            self._wait(work)
        return to_device(payload, self.compute) if self.compute is not None and kind == ACT else payload

    def _wait(self, work: Any) -> None:
        """Wait for a receive: the host for a header (gloo), the current stream for a payload on a GPU (NCCL)."""
        try:
            work.wait()
        except Exception as exc:
            raise self._timeout() if wait_failure(exc) is WaitFailure.TIMEOUT else self._failed(exc) from exc

    def _timeout(self) -> PeerTimeout:
        return PeerTimeout(
            f"rank {self.rank} received nothing from rank {self.prev} for {self.timeout_s:.0f} s "
            "(a peer failed or hangs; raise --timeout for slow models)",
            peer=self.prev,
        )

    def _failed(self, exc: BaseException) -> PeerLinkError:
        return PeerLinkError(f"rank {self.rank}: receive from rank {self.prev} failed: {exc}", peer=self.prev)

    # ------------------------------------------------------------ wire format

    def _meta_words(self) -> int:
        return _FIXED + 4 * self.max_seqs

    def _pack(self, msg: Message) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The header, with the payload inside it when it fits, else also the payload.

        Layout (int64 words): kind, mb, step, stage, n, tokens, width, flags, then the n slots, n starts,
        n lens and n request ids; an inline payload's bytes follow at once. This runs on every hop, so it
        keeps to numpy and as few torch calls as it can (each costs about a microsecond, several times that
        with cold caches).
        """
        if msg.batch is None or msg.payload is None:
            h = np.zeros(_FIXED, dtype=np.int64)
            h[:4] = (msg.kind, msg.mb, msg.step, msg.stage)
            return torch.from_numpy(h), None
        batch, payload = msg.batch, msg.payload
        if payload.requires_grad:
            payload = payload.detach()
        if not payload.is_contiguous():
            payload = payload.contiguous()
        n = len(batch.lens)
        nbytes = payload.numel() * payload.element_size()
        inline = nbytes <= self.inline_nbytes
        meta = _FIXED + 4 * n
        h = np.zeros(meta + -(-nbytes // 8) if inline else meta, dtype=np.int64)
        width = payload.shape[1] if payload.dim() == 2 else 0
        flags = _DTYPES.index(payload.dtype) | (_INLINE if inline else 0)
        fields = (msg.kind, msg.mb, msg.step, msg.stage, n, sum(batch.lens), width, flags)
        h[:meta] = (*fields, *batch.slots, *batch.starts, *batch.lens, *batch.seq_ids())
        if not inline:
            return torch.from_numpy(h), payload
        h[meta:].view(np.uint8)[:nbytes] = _host_view(payload).reshape(-1).view(np.uint8)
        return torch.from_numpy(h), None

    def _parse(self, h: torch.Tensor) -> tuple[Message, list[int] | None, torch.dtype]:
        """The message; when its payload follows separately, also the payload's shape and dtype."""
        hn = h.numpy()
        kind, mb, step, stage, n, tokens, width, flags = hn[:_FIXED].tolist()
        msg = Message(kind=kind, mb=mb, step=step, stage=stage)
        if kind in (STOP, PING):
            return msg, None, torch.int64
        meta = _FIXED + 4 * n
        v = hn[_FIXED:meta].tolist()
        msg.batch = Batch(slots=v[:n], starts=v[n : 2 * n], lens=v[2 * n : 3 * n], seqs=v[3 * n :])
        shape = [tokens, width] if kind == ACT else [n]
        dtype = _DTYPES[flags & ~_INLINE]
        if flags & _INLINE:
            count = tokens * width if kind == ACT else n
            raw = hn[meta:].view(_NUMPY[dtype])[:count].reshape(shape).copy()  # the buffer is posted again
            msg.payload = torch.from_numpy(raw) if dtype != torch.bfloat16 else torch.from_numpy(raw).view(dtype)
            return msg, None, dtype
        return msg, shape, dtype

    def _consumer_stage(self, msg: Message) -> int:
        return msg.stage if msg.kind == ACT else self.rank

    # ------------------------------------------------------------ the reaper thread

    def _reap_loop(self) -> None:
        if self.device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(self.device)
        try:
            while True:
                # Wake up on a timer, not per send: a wake-up per hop would compete for the CPU with the
                # ranks' own work at the moment a message moves.
                closing = self._closing.wait(REAP_S)
                while self._sent and (closing or self._sent[0].done()):
                    for work in self._sent[0].works:
                        work.wait()
                    self._sent.popleft()
                if closing:
                    if self.cuda:
                        torch.cuda.current_stream(self.device).synchronize()  # the last payloads are out
                    return
        except BaseException as exc:  # the compute thread raises it at its next send or close
            self.error = exc


class _Waiter:
    """A thread that waits for one posted header receive (on the host: headers always travel over gloo), so
    that the compute thread can give up waiting for it."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.done = threading.Event()
        self.error: BaseException | None = None
        threading.Thread(target=self._wait, name="ppscope-recv-wait", daemon=True).start()

    def _wait(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:
            self.error = exc
        self.done.set()


@dataclass
class _Posted:
    """Sends posted by the compute thread, waiting for completion."""

    works: list[Any]
    keep: tuple[Any, ...]
    """The tensors being sent, alive until the sends complete."""
    device_work: Any = None
    """The payload's send on a GPU (NCCL), whose wait() would only make a stream wait: polled instead."""

    def done(self) -> bool:
        """Whether waiting for the works now keeps the host only as long as a gloo send takes."""
        return self.device_work is None or bool(self.device_work.is_completed())


def _host_view(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor as a numpy array sharing its memory (bfloat16, which numpy lacks, as int16)."""
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()

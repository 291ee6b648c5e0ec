"""The ring: rank r receives only from r-1 and sends only to r+1 (the last rank sends sampled tokens to rank 0).

Each message is a fixed-size int64 header (what it is, which micro-batch, which sequences) followed by its
payload (activations `(N, D)` or token ids `(B,)`); a payload that fits rides inside the header, so a
decode hop is one message. A receiver thread keeps a receive posted from the predecessor and queues what
arrives; the compute thread posts its sends with `isend` (its `send` span is the time it is blocked:
posting) and a reaper thread waits for their completion, keeping the tensors alive until then. So compute
never blocks on the network and the ring cannot deadlock however many micro-batches circulate. The
compute thread records `recv_wait` when it blocks on the inbox. The wrap-around link (last rank -> rank 0)
uses its own process group so that with two ranks the two directions never share a communicator (NCCL
orders the operations of one communicator). This module knows nothing about models or schedules.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.model import Batch
from ppscope.recorder import Recorder
from ppscope.trace import SpanKind

__all__ = ["ACT", "STOP", "TOKENS", "Message", "Ring"]

ACT, TOKENS, STOP = 1, 2, 3
_FIXED = 8
_INLINE = 1 << 8  # flag in the dtype word: the payload travels inside the header
_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]


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
        return "prefill" if self.step == 0 else "decode"


class Ring:
    """Point-to-point links of one rank. With one rank, messages go straight to its own inbox."""

    def __init__(
        self,
        rank: int,
        world: int,
        recorder: Recorder,
        max_seqs: int,
        device: torch.device,
        timeout_s: float,
        inline_nbytes: int = 0,
    ) -> None:
        self.rank, self.world = rank, world
        self.prev, self.next = (rank - 1) % world, (rank + 1) % world
        self.rec = recorder
        self.max_seqs = max_seqs
        self.inline_nbytes = -(-max(inline_nbytes, 8 * max_seqs) // 8) * 8
        """Payloads up to this size ride in the header: one message per hop instead of two (CPU only)."""
        self.device = device
        self.timeout_s = timeout_s
        self.inbox: queue.Queue[Message | BaseException] = queue.Queue()
        self._outbox: queue.Queue[_Posted | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._groups: tuple[Any, Any] = (None, None)
        self.error: BaseException | None = None

    def start(self) -> None:
        if self.world == 1:
            return
        # Every rank must create the groups in the same order.
        wrap = dist.new_group(list(range(self.world)))
        self._groups = (None, wrap)
        for target, name in ((self._recv_loop, "recv"), (self._reap_loop, "send")):
            t = threading.Thread(target=target, name=f"ppscope-{name}-r{self.rank}", daemon=True)
            t.start()
            self._threads.append(t)

    def _group(self, src: int) -> Any:
        return self._groups[1] if src == self.world - 1 else self._groups[0]

    # ------------------------------------------------------------ compute-thread side

    def send(self, msg: Message) -> None:
        if self.world == 1:
            self.inbox.put(msg)
            return
        # Post the sends here (they return at once) so no thread hop sits on the critical path; the reaper
        # thread waits for their completion and records the send span.
        start = self.rec.now_ns()
        group = self._group(self.rank)
        header, payload = self._header(msg)
        header = header.to(self.device)
        works = [dist.isend(header, dst=self.next, group=group)]
        if payload is not None:
            works.append(dist.isend(payload, dst=self.next, group=group))
        if msg.kind != STOP:
            # The stage is blocked only while posting: the receiver always has a receive posted, so a send
            # never waits for it. The transfer shows as the receiver's `recv` span.
            src_stage = msg.stage - 1 if msg.kind == ACT else msg.stage
            self.rec.record(
                SpanKind.SEND, start, self.rec.now_ns(), mb=msg.mb, step=msg.step, phase=msg.phase,
                stage=src_stage, chunk=max(src_stage, 0) // self.world, peer=self.next, nbytes=_nbytes(msg.payload),
            )  # fmt: skip
        self._outbox.put(_Posted(msg, start, works, (header, payload)))

    def get(self) -> Message:
        """The next message from the predecessor; raises if the link failed or nothing came within the timeout."""
        try:
            item = self.inbox.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"rank {self.rank} received nothing from rank {self.prev} for {self.timeout_s:.0f} s "
                "(a peer failed or hangs; raise --timeout for slow models)"
            ) from None
        if isinstance(item, BaseException):
            raise item
        return item

    def poll(self, timeout_s: float) -> Message | None:
        """The next message if one arrives within `timeout_s`, else None."""
        try:
            item = self.inbox.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._outbox.put(None)
        for t in self._threads:
            t.join(timeout=self.timeout_s)
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------ wire format

    def _meta_words(self) -> int:
        return _FIXED + 3 * self.max_seqs

    def _header(self, msg: Message) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The header, with the payload inside it when it fits (decode steps, tokens), else also the payload."""
        words, m = self._meta_words(), self.max_seqs
        meta = [0] * words  # built as a list: one tensor op instead of a dozen on the hot path
        meta[:4] = [msg.kind, msg.mb, msg.step, msg.stage]
        if msg.batch is None or msg.payload is None:
            return torch.tensor(meta + [0] * (self.inline_nbytes // 8), dtype=torch.int64), None
        n = len(msg.batch.lens)
        payload = msg.payload.detach().contiguous()
        payload = payload if self.device.type == "cuda" else payload.cpu()
        nbytes = payload.numel() * payload.element_size()
        inline = nbytes <= self.inline_nbytes and self.device.type != "cuda"
        width = payload.shape[1] if payload.dim() == 2 else 0
        meta[4:8] = [n, msg.batch.tokens, width, _DTYPES.index(payload.dtype) | (_INLINE if inline else 0)]
        meta[_FIXED : _FIXED + n] = msg.batch.slots
        meta[_FIXED + m : _FIXED + m + n] = msg.batch.starts
        meta[_FIXED + 2 * m : _FIXED + 2 * m + n] = msg.batch.lens
        h = torch.zeros(words + self.inline_nbytes // 8, dtype=torch.int64)
        h[:words] = torch.tensor(meta, dtype=torch.int64)
        if inline:
            h.view(torch.uint8)[words * 8 : words * 8 + nbytes] = payload.view(-1).view(torch.uint8)
            return h, None
        return h, payload

    def _parse(self, h: torch.Tensor) -> tuple[Message, list[int] | None, torch.dtype]:
        """The message; when its payload follows separately, also the payload's shape and dtype."""
        words = self._meta_words()
        v = h[:words].tolist()
        msg = Message(kind=v[0], mb=v[1], step=v[2], stage=v[3])
        if msg.kind == STOP:
            return msg, None, torch.int64
        n, m = v[4], self.max_seqs
        msg.batch = Batch(
            slots=v[_FIXED : _FIXED + n],
            starts=v[_FIXED + m : _FIXED + m + n],
            lens=v[_FIXED + 2 * m : _FIXED + 2 * m + n],
        )
        shape = [v[5], v[6]] if msg.kind == ACT else [n]
        dtype = _DTYPES[v[7] & ~_INLINE]
        if v[7] & _INLINE:
            nbytes = _numel(shape) * torch.empty(0, dtype=dtype).element_size()
            raw = h.view(torch.uint8)[words * 8 : words * 8 + nbytes].clone()
            msg.payload = raw.view(dtype).reshape(shape)
            return msg, None, dtype
        return msg, shape, dtype

    # ------------------------------------------------------------ threads

    def _thread_device(self) -> None:
        if self.device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(self.device)

    def _recv_loop(self) -> None:
        self._thread_device()
        group = self._group(self.prev)
        size = self._meta_words() + self.inline_nbytes // 8
        try:
            while True:
                header = torch.empty(size, dtype=torch.int64, device=self.device)
                dist.recv(header, src=self.prev, group=group)
                msg, shape, dtype = self._parse(header.cpu())
                if shape is not None:
                    start = self.rec.now_ns()
                    payload = torch.empty(shape, dtype=dtype, device=self.device)
                    dist.recv(payload, src=self.prev, group=group)
                    if self.device.type == "cuda":
                        torch.cuda.current_stream(self.device).synchronize()
                    msg.payload = payload
                    self.rec.record(
                        SpanKind.RECV, start, self.rec.now_ns(), mb=msg.mb, step=msg.step, phase=msg.phase,
                        stage=self._consumer_stage(msg), chunk=self._consumer_stage(msg) // self.world,
                        peer=self.prev, nbytes=payload.numel() * payload.element_size(),
                    )  # fmt: skip
                self.inbox.put(msg)
                if msg.kind == STOP:
                    return
        except BaseException as exc:  # hand the failure to the compute thread
            self.error = exc
            self.inbox.put(RuntimeError(f"rank {self.rank}: receive from rank {self.prev} failed: {exc}"))

    def _consumer_stage(self, msg: Message) -> int:
        return msg.stage if msg.kind == ACT else self.rank

    def _reap_loop(self) -> None:
        self._thread_device()
        try:
            while True:
                posted = self._outbox.get()
                if posted is None:
                    return
                for work in posted.works:
                    work.wait()
        except BaseException as exc:
            self.error = exc
            self.inbox.put(RuntimeError(f"rank {self.rank}: send to rank {self.next} failed: {exc}"))


@dataclass
class _Posted:
    """Sends posted by the compute thread, waiting for completion."""

    msg: Message
    start_ns: int
    works: list[Any]
    keep: tuple[Any, ...]
    """The tensors being sent, alive until the sends complete."""


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()

"""The schedule loops: gpipe, interleaved and serve, every step inside a recorder span.

Rank 0 drives: it embeds prompts and sampled tokens, decides which micro-batch goes next (following its
rank's list in `ppscope.simulate.schedule` for gpipe/interleaved, admitting requests as they arrive for serve) and
collects the tokens that come back from the last stage. Every other rank follows: it processes whatever
its predecessor sends, in arrival order, which is its own list of the plan because every rank runs the
same order. On a GPU the compute spans are timed by CUDA events (`ppscope.engine.gputime`), so nothing here waits for
the device. This module knows nothing about processes, files or clocks beyond the recorder's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from ppscope.engine.comm import ACT, PING, STOP, TOKENS, Message, Ring
from ppscope.engine.gputime import DeviceSpans
from ppscope.engine.model import Batch, to_device
from ppscope.engine.requests import Arrivals, Request
from ppscope.engine.sampling import Sampling, row_keys, sample
from ppscope.engine.stage import LayerTimer, StageModule
from ppscope.simulate.schedule import ServePolicy, make_schedule
from ppscope.trace.layers import layer_span_name
from ppscope.trace.model import SpanKind
from ppscope.trace.recorder import Recorder

__all__ = ["Pipeline"]

ProgressFn = Callable[[int, int], None]
"""Called with (requests finished, tokens generated)."""


@dataclass
class _Slot:
    """A micro-batch that circulates: the requests of its pass in flight, each with its KV-cache row (rows
    k * max_batch .. k * max_batch + max_batch - 1 belong to slot k); `step` counts slot k's passes over the
    whole run, through every request it takes, so (micro-batch, step) names one pass of a serve run."""

    requests: list[Request]
    step: int = 0
    cache_slots: list[int] = field(default_factory=list)

    def drop_done(self) -> None:
        live = [(r, c) for r, c in zip(self.requests, self.cache_slots, strict=True) if not r.done]
        self.requests, self.cache_slots = [r for r, _ in live], [c for _, c in live]

    def admit(self, waiting: Arrivals, now_ns: int, first_row: int, max_batch: int) -> None:
        """Arrived requests (FIFO) take the free rows, up to `max_batch`; their prompts join the next pass."""
        free = sorted(set(range(first_row, first_row + max_batch)) - set(self.cache_slots))
        while free and waiting.due(now_ns):
            self.requests.append(waiting.pop())
            self.cache_slots.append(free.pop(0))


class Pipeline:
    """One rank's view of the pipeline: its stage module, its ring links and its recorder."""

    def __init__(
        self,
        *,
        module: StageModule,
        ring: Ring,
        recorder: Recorder,
        hidden: int,
        vocab: int,
        dtype: torch.dtype,
        chunks: int,
        sampling: Sampling,
        device_spans: DeviceSpans | None = None,
    ) -> None:
        """`device_spans`: what times the spans on a device; on a GPU (when recording) CUDA events on the
        current stream unless given (tests give a stand-in on a CPU)."""
        self.m = module
        self.ring = ring
        self.rec = recorder
        self.rank, self.ranks = ring.rank, ring.world
        self.last_stage = self.ranks * chunks - 1
        self.hidden, self.vocab, self.dtype, self.chunks = hidden, vocab, dtype, chunks
        self.sampling = sampling
        self.cuda = module.device.type == "cuda"
        self.device_spans = device_spans if recorder.enabled else None
        if self.device_spans is None and self.cuda and recorder.enabled:
            stream = torch.cuda.current_stream(module.device)
            self.device_spans = DeviceSpans(
                recorder,
                stream,
                lambda: torch.cuda.Event(enable_timing=True),
                anchor_stream=torch.cuda.Stream(module.device),  # renewed on time however busy the GPU is
            )
        ring.device_spans = self.device_spans
        self.on_finish: Callable[[Request], None] = lambda request: None
        """Called on rank 0 when a request has its last token (the worker appends it to requests.jsonl)."""
        self.before_pass: Callable[[int], None] = lambda passes: None
        """Called with each pass's number (from 1) before it runs: where a test injects a failure
        (`ppscope.engine.testing.failure_after`)."""
        self.alternate_ns = 0
        """Benchmarks: pause recording in every other window of this many ns of the host clock (0 = never)."""
        self.layer_every = 0
        """Time each decoder layer of every this-many-th pass of each virtual stage as a `layer` span (0 = never)."""
        self.layer_alternate_ns = 0
        """Benchmarks: take layer spans only in every other window of this many ns of the host clock (0 = always)."""
        self._passes = 0
        self._stage_passes: dict[int, int] = {}

    # ------------------------------------------------------------ one pass of one virtual stage

    def _span(self, kind: str, **fields: Any) -> AbstractContextManager[Any]:
        """A compute span: on a GPU timed by CUDA events on the stream (the host does not wait for the
        work), on a CPU by the recorder's clock around the work itself."""
        if self.device_spans is not None:
            return self.device_spans.span(kind, **fields)
        return self.rec.span(kind, **fields)

    def close(self) -> None:
        """Hand the device-timed spans still in flight to the recorder (waits for the GPU)."""
        if self.device_spans is not None:
            self.device_spans.close()

    def run_stage(self, stage: int, mb: int, step: int, batch: Batch, data: torch.Tensor) -> Message:
        """Run virtual stage `stage` on one micro-batch: embed first if it is stage 0, head and sampling if last.
        Called inside the drivers' inference mode."""
        self._passes += 1
        self.before_pass(self._passes)
        if self.alternate_ns:
            self.rec.set_paused(self.rec.now_ns() // self.alternate_ns % 2 == 1)
        chunk = stage // self.ranks
        phase = batch.phase
        n = batch.tokens
        x = data
        if stage == 0:
            with self._span(SpanKind.EMBED, stage=0, mb=mb, step=step, phase=phase, tokens=n):
                x = self.m.run_embed(to_device(data, self.m.device), self.hidden, self.dtype)
        timer = self._layer_timer(stage, chunk, mb, step, phase, n)
        with self._span(SpanKind.FORWARD, stage=stage, chunk=chunk, mb=mb, step=step, phase=phase, tokens=n):
            x = self.m.run_chunk(chunk, x, batch, timer)
        if self.device_spans is not None:
            self.device_spans.poll()  # what earlier passes put on the GPU and has finished
        if stage < self.last_stage:
            return Message(ACT, mb, step, stage + 1, batch, x)
        rows = len(batch.lens)  # the head and the sampler see each sequence's last token only
        with self._span(SpanKind.HEAD, stage=stage, chunk=chunk, mb=mb, step=step, phase=phase, tokens=rows):
            logits = self.m.run_head(x, batch, self.vocab)
        with self._span(SpanKind.SAMPLE, stage=stage, chunk=chunk, mb=mb, step=step, phase=phase, tokens=rows):
            keys = None
            if self.sampling.temperature > 0:  # a sequence's draws whatever its slot, micro-batch or schedule
                positions = [start + length for start, length in zip(batch.starts, batch.lens, strict=True)]
                keys = row_keys(self.sampling.seed, batch.seq_ids(), positions)
            ids = sample(logits, self.sampling, keys)
        return Message(TOKENS, mb, step, stage, batch, ids.to(torch.int64))

    def warm_up(self, seqs: int, prompt_len: int) -> None:
        """Every kernel this rank runs, called once before the run (`StageModule.warm_up`), the sampler too."""
        with torch.inference_mode():
            logits = self.m.warm_up(seqs, prompt_len, self.hidden, self.vocab, self.dtype)
            if logits is not None:
                rows = logits.shape[0]
                keys = row_keys(self.sampling.seed, list(range(rows)), [prompt_len] * rows)
                sample(logits, self.sampling, keys if self.sampling.temperature > 0 else None)
        if self.cuda:
            torch.cuda.synchronize(self.m.device)

    def _layer_timer(self, stage: int, chunk: int, mb: int, step: int, phase: str, tokens: int) -> LayerTimer | None:
        """What times each layer of this pass, when it is the sampled k-th pass of its stage (the count starts
        at the stage's first pass, so the k-th, 2k-th, ...), else None: the layers run untimed."""
        if not self.layer_every or not self.rec.enabled:
            return None
        count = self._stage_passes.get(stage, 0) + 1
        self._stage_passes[stage] = count
        if count % self.layer_every:
            return None
        if self.layer_alternate_ns and self.rec.now_ns() // self.layer_alternate_ns % 2 == 1:
            return None

        def timer(index: int) -> AbstractContextManager[Any]:
            return self._span(
                SpanKind.LAYER,
                stage=stage,
                chunk=chunk,
                mb=mb,
                step=step,
                phase=phase,
                tokens=tokens,
                name=layer_span_name(index),
            )

        return timer

    def _receive(self, msg_wait: Callable[[], Message | None]) -> Message | None:
        start = self.rec.now_ns()
        with self.rec.nvtx_range(SpanKind.RECV_WAIT):  # which micro-batch comes is known only when it has come
            msg = msg_wait()
        if msg is not None and msg.kind not in (STOP, PING) and not self.ring.device_timed:  # GPU: the ring times it
            stage = msg.stage if msg.kind == ACT else 0
            self.rec.record(
                SpanKind.RECV_WAIT,
                start,
                self.rec.now_ns(),
                stage=stage,
                chunk=stage // self.ranks,
                mb=msg.mb,
                step=msg.step,
                phase=msg.phase,
                peer=self.ring.prev,
                nbytes=_nbytes(msg),
            )
        return msg

    def _get(self) -> Message:
        msg = self._receive(self.ring.get)
        assert msg is not None
        return msg

    # ------------------------------------------------------------ followers (every rank but 0)

    @torch.inference_mode()  # once per loop, not per pass: entering it costs a few microseconds
    def follow(self) -> None:
        """Process what the predecessor sends until it says stop; pass the stop on."""
        while True:
            msg = self._get()
            if msg.kind == STOP:
                self.ring.send(msg)
                return
            if msg.kind == PING:
                self.ring.send(msg)
                continue
            if msg.kind != ACT or msg.batch is None or msg.payload is None:
                raise RuntimeError(f"rank {self.rank} got an unexpected message (kind {msg.kind}) from its predecessor")
            self.ring.send(self.run_stage(msg.stage, msg.mb, msg.step, msg.batch, msg.payload))

    def _stop(self) -> None:
        """Send stop round the ring and wait for it to come back, so every rank has finished its work."""
        self.ring.send(Message(STOP))
        while self._get().kind != STOP:
            pass

    # ------------------------------------------------------------ gpipe / interleaved (rank 0)

    @torch.inference_mode()
    def drive_batch(self, schedule: str, requests: Sequence[Request], microbatches: int, progress: ProgressFn) -> None:
        """gpipe / interleaved: the requests in `microbatches` groups, every step flushed."""
        groups = [requests[i::microbatches] for i in range(microbatches)]
        plan = make_schedule(schedule, self.ranks, microbatches, self.chunks)
        order = plan.for_rank(0)
        start_ns = self.rec.now_ns()
        for r in requests:
            r.arrival_ns = start_ns
        steps = max(r.max_new_tokens for r in requests)
        done_tokens = 0
        for step in range(steps):
            live = {m: [r for r in g if not r.done] for m, g in enumerate(groups)}
            live = {m: g for m, g in live.items() if g}
            back: set[int] = set()

            def on_tokens(msg: Message, live: dict[int, list[Request]] = live, back: set[int] = back) -> None:
                nonlocal done_tokens
                done_tokens += self._apply_tokens(live[msg.mb], msg)  # stamped when they arrive
                back.add(msg.mb)

            for action in order:
                reqs = live.get(action.mb)
                if reqs is None:
                    continue
                if plan.chunk_of(action.stage) == 0:
                    batch, ids = _batch_of(reqs, [r.id for r in reqs])
                    out = self.run_stage(action.stage, action.mb, step, batch, ids)
                else:
                    msg = self._take_act(action.mb, action.stage, on_tokens)
                    assert msg.batch is not None and msg.payload is not None
                    out = self.run_stage(action.stage, action.mb, step, msg.batch, msg.payload)
                if out.kind == TOKENS and self.ranks == 1:
                    on_tokens(out)  # its own tokens, in hand now: queued, they would wait for the step's other passes
                else:
                    self.ring.send(out)
            while back != set(live):  # the flush: every micro-batch's token is back before the next step
                self._take_act(-1, -1, on_tokens)
            progress(sum(r.done for r in requests), done_tokens)
        self._stop()

    def _take_act(self, mb: int, stage: int, on_tokens: Callable[[Message], None]) -> Message:
        """The activation (mb, stage) from the last rank (mb -1: any message); tokens that come first go to
        `on_tokens`."""
        while True:
            msg = self._get()
            if msg.kind == TOKENS:
                on_tokens(msg)
                if mb < 0:
                    return msg
                continue
            if msg.kind != ACT or (msg.mb, msg.stage) != (mb, stage):
                raise RuntimeError(f"rank 0 expected mb {mb} for stage {stage}, got kind {msg.kind} mb {msg.mb}")
            return msg

    def _apply_tokens(self, reqs: list[Request], msg: Message) -> int:
        assert msg.payload is not None
        ids = msg.payload.tolist()  # in host memory (on a GPU the ring waited for their copy alone)
        now = self.rec.now_ns()
        for r, tok in zip(reqs, ids, strict=True):
            r.output_ids.append(int(tok))
            r.token_ns.append(now)
            if r.first_token_ns < 0:
                r.first_token_ns = now
            if r.done:
                r.finish_ns = now
                self.on_finish(r)
                r.token_ns = []  # logged: a long serve keeps no per-token times of finished requests
        return len(reqs)

    # ------------------------------------------------------------ serve (rank 0)

    @torch.inference_mode()
    def drive_serve(
        self,
        requests: Sequence[Request],
        arrivals_ns: Sequence[int],
        policy: ServePolicy,
        timeout_s: float,
        progress: ProgressFn,
    ) -> None:
        """Continuous batching: up to `max_inflight` micro-batches circulate, each of up to `max_batch` requests.
        When a micro-batch's tokens come back its finished requests leave, and arrived ones (FIFO) take their
        places at once, their prefill in the same pass as the others' decode (`policy.prefill_joins_decode`;
        otherwise a micro-batch takes new requests only once all of its own are done)."""
        start_ns = self.rec.now_ns()
        waiting = Arrivals(requests, arrivals_ns, start_ns)
        slots: list[_Slot | None] = [None] * policy.max_inflight
        passes = [0] * policy.max_inflight  # of each slot while it is empty
        finished = tokens = 0
        keepalive_ns, pinged_ns = int(timeout_s / 3 * 1e9), start_ns
        while finished < len(requests):
            now = self.rec.now_ns()
            for k, slot in enumerate(slots):
                if slot is None and waiting.due(now):
                    slots[k] = new = _Slot([], step=passes[k])
                    new.admit(waiting, now, k * policy.max_batch, policy.max_batch)
                    self._launch(k, new)
            busy = any(s is not None for s in slots)
            wait_s = timeout_s if busy else 0.0
            if waiting and any(s is None for s in slots):
                wait_s = min(wait_s or timeout_s, max((waiting.next_ns() - now) / 1e9, 0.0))
            if not busy and wait_s > 0:  # idle until the next arrival: no stage work to wait for
                if self.ranks > 1 and self.rec.now_ns() - pinged_ns > keepalive_ns:
                    self.ring.send(Message(PING))  # the others wait for rank 0 at most the link's timeout
                    pinged_ns = self.rec.now_ns()
                msg = self.ring.poll(min(wait_s, keepalive_ns / 1e9))
            elif busy:
                msg = self._receive(functools.partial(self.ring.poll, wait_s))
                if msg is None and not (waiting and any(s is None for s in slots)):
                    raise TimeoutError(f"rank 0 received no tokens for {timeout_s:.0f} s (a peer failed or hangs)")
            else:
                continue
            if msg is None or msg.kind == PING:
                continue
            if msg.kind != TOKENS or slots[msg.mb] is None:
                raise RuntimeError(f"rank 0 expected tokens, got kind {msg.kind} for micro-batch {msg.mb}")
            slot = slots[msg.mb]
            assert slot is not None
            tokens += self._apply_tokens(slot.requests, msg)
            finished += sum(r.done for r in slot.requests)
            slot.step += 1
            slot.drop_done()
            if slot.requests and policy.prefill_joins_decode:
                slot.admit(waiting, self.rec.now_ns(), msg.mb * policy.max_batch, policy.max_batch)
            if slot.requests:
                self._launch(msg.mb, slot)
            else:
                slots[msg.mb], passes[msg.mb] = None, slot.step  # taken by the next arrivals at the top of the loop
            progress(finished, tokens)
        self._stop()

    def _launch(self, k: int, slot: _Slot) -> None:
        batch, ids = _batch_of(slot.requests, slot.cache_slots)
        self.ring.send(self.run_stage(0, k, slot.step, batch, ids))


def _batch_of(reqs: list[Request], cache_slots: list[int]) -> tuple[Batch, torch.Tensor]:
    """The batch and input ids of a pass: a request's whole prompt in its first pass, its last token after."""
    starts, lens, ids = [], [], []
    for r in reqs:
        if r.output_ids:  # decode: the last token, at the position after everything before it
            starts.append(len(r.prompt_ids) + len(r.output_ids) - 1)
            lens.append(1)
            ids.append(r.output_ids[-1])
        else:  # prefill
            starts.append(0)
            lens.append(len(r.prompt_ids))
            ids.extend(r.prompt_ids)
    return Batch(cache_slots, starts, lens, [r.id for r in reqs]), torch.tensor(ids)


def _nbytes(msg: Message) -> int:
    return 0 if msg.payload is None else msg.payload.numel() * msg.payload.element_size()

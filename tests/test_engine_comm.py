"""The ring's wire format over gloo between two real processes, three header receives posted ahead: payloads
inside the header, payloads too big for it (a second message, own tag), tokens on the wrap-around link, and
stop; each arrives intact and in order. Also with the headers on groups of their own and every payload on the
process group, the protocol of a GPU ring (there the payloads go over NCCL); and through host memory, as
gloo carries a GPU stage's activations (`--device cuda`): each activation is moved onto the stage's device
inside its receive span, tokens stay on the host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppscope.engine.comm import ACT, STOP, TOKENS, Message, Ring
from ppscope.engine.model import Batch
from ppscope.trace.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import datetime, os, sys
import torch, torch.distributed as dist
from ppscope.engine.comm import ACT, STOP, TOKENS, Message, Ring
from ppscope.engine.model import Batch
from ppscope.trace.recorder import Recorder

rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
host_headers = mode != "one group"
import nvtx

class Spy:  # an NVTX domain that remembers the message of every range pushed
    def __init__(self): self.pushed, self.depth = [], 0
    def get_category_id(self, name): return 0
    def get_event_attributes(self, message, **kw): return message
    def push_range(self, attr=None): self.pushed.append(attr); self.depth += 1
    def pop_range(self): self.depth -= 1
    def mark(self, **kw): pass

spy = Spy()
nvtx.get_domain = lambda name: spy
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
moved = []
if mode == "host memory":  # the stage computes on another device: what the ring moves there
    import ppscope.engine.comm as comm
    comm.to_device = lambda t, device: moved.append((tuple(t.shape), str(device))) or t
ring = Ring(rank, 2, Recorder(None, rank=rank, stage=rank), 4, torch.device("cpu"), 30, inline_nbytes=256, depth=3,
            host_headers=host_headers and mode != "host memory",  # through host memory: the ring's own choice
            compute=torch.device("meta") if mode == "host memory" else None)
assert ring.host_headers == host_headers and ring.inline_nbytes == (0 if host_headers else 256)
if mode in ("device-timed", "host memory"):  # a GPU ring's spans, on a stand-in for a stream whose work is done at once
    import time
    from ppscope.engine.gputime import DeviceSpans

    class Now:
        def record(self, stream=None): self.at = time.perf_counter_ns()
        def query(self): return True
        def synchronize(self): pass
        def elapsed_time(self, end): return (end.at - self.at) / 1e6

    class Stream:
        def synchronize(self): pass

    ring.device_spans = DeviceSpans(ring.rec, Stream(), Now)
ring.start()
batch = Batch([0, 1], [0, 0], [3, 5], [7, 9])  # slots, starts, lens, request ids
g = torch.Generator().manual_seed(7)
small = torch.randn(8, 16, generator=g).to(torch.bfloat16)  # 256 bytes: inside the header
big = torch.randn(8, 64, generator=g)  # 2 KiB: a second message
if rank == 0:
    for mb, x in enumerate((small, big, small, big)):
        ring.send(Message(ACT, mb, 0, 1, batch, x))
    for mb in range(4):
        msg = ring.get()
        assert (msg.kind, msg.mb, msg.stage) == (TOKENS, mb, 1), msg
        assert msg.payload.tolist() == [mb, 10 * mb], msg.payload
    ring.send(Message(STOP))
    assert ring.get().kind == STOP
else:
    for mb, x in enumerate((small, big, small, big)):
        msg = ring.get()
        assert (msg.kind, msg.mb, msg.step, msg.stage) == (ACT, mb, 0, 1), msg
        assert msg.batch == batch and msg.payload.dtype == x.dtype and torch.equal(msg.payload, x), mb
        ring.send(Message(TOKENS, mb, 0, 1, batch, torch.tensor([mb, 10 * mb])))
    assert ring.get().kind == STOP
    ring.send(Message(STOP))
ring.close()
dist.destroy_process_group()
if mode == "host memory":
    assert moved == ([((8, 16), "meta"), ((8, 64), "meta")] * 2 if rank == 1 else []), moved
if mode in ("device-timed", "host memory"):
    assert len(ring.rec.frame()) == 0 and ring.device_spans.pending == 8  # all through the device timer
    ring.device_spans.close()
    spans = ring.rec.frame()
    got = sorted(zip(spans["kind"].astype(str), spans["mb"]))
    assert got == sorted([("send", mb) for mb in range(4)] + [("recv_wait", mb) for mb in range(4)]), got
if mode == "one group":  # the ring's own ranges: each send posted, each separate payload's transfer
    sends = [f"s{rank} send mb{mb}" for mb in range(4)]
    recvs = [f"s{rank} recv mb{mb}" for mb in (1, 3)] if rank == 1 else []  # the big ones; tokens fit
    assert sorted(spy.pushed) == sorted(sends + recvs) and spy.depth == 0, spy.pushed
print("ok", rank)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one group", "headers on their own groups", "device-timed", "host memory"])
def test_messages_cross_two_processes_intact(tmp_path: Path, mode: str) -> None:
    """Device-timed: spans go through the device timer (on a GPU, the compute stream) and every receive is a
    `recv_wait`, the stream's wait for its payload; there is no host-timed `recv`."""
    from ppscope.engine.launch import free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(r), port, mode],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 and f"ok {r}" in out, f"rank {r}: {err[-2000:]}"


def test_single_rank_ring_loops_back() -> None:
    ring = Ring(0, 1, Recorder(None, rank=0, stage=0), 2, torch.device("cpu"), 5)
    ring.start()
    ring.send(Message(TOKENS, 3, 1, 0, Batch([0], [4], [1]), torch.tensor([9])))
    assert ring.get().mb == 3
    assert ring.poll(0.0) is None
    with pytest.raises(RuntimeError, match="nobody sent"):
        ring.get()
    ring.close()


def test_header_holds_the_payload_only_when_it_fits() -> None:
    ring = Ring(0, 2, Recorder(None, rank=0, stage=0), 4, torch.device("cpu"), 5, inline_nbytes=256)
    batch = Batch([2, 0], [5, 9], [1, 1], [40, 12])
    for x in (torch.randn(2, 32), torch.randn(2, 64)):  # 256 bytes fit, 512 do not
        header, payload = ring._pack(Message(ACT, 1, 3, 2, batch, x))
        msg, shape, dtype = ring._parse(header)
        assert (msg.kind, msg.mb, msg.step, msg.stage, msg.batch) == (ACT, 1, 3, 2, batch)
        if x.numel() * 4 <= 256:
            assert payload is None and shape is None and torch.equal(msg.payload, x)
        else:
            assert payload is not None and torch.equal(payload, x) and shape == [2, 64] and dtype == torch.float32
    header, payload = ring._pack(Message(STOP))
    assert payload is None and ring._parse(header)[0].kind == STOP


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_inline_payload_of_every_dtype_comes_back_bit_for_bit(dtype: torch.dtype) -> None:
    ring = Ring(0, 2, Recorder(None, rank=0, stage=0), 4, torch.device("cpu"), 5, inline_nbytes=4096)
    batch = Batch([3, 1, 0], [7, 0, 2], [2, 3, 1], [8, 2**40, 0])
    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(1)).to(dtype)  # 6 tokens of width 12
    header, payload = ring._pack(Message(ACT, 2, 5, 1, batch, x))
    msg, shape, _ = ring._parse(header)
    assert payload is None and shape is None and msg.batch == batch and (msg.mb, msg.step, msg.stage) == (2, 5, 1)
    assert msg.payload is not None and msg.payload.dtype == dtype and msg.payload.shape == x.shape
    assert torch.equal(msg.payload.view(torch.uint8), x.view(torch.uint8))
    ids = torch.tensor([11, 2**40, -3])
    msg, _, _ = ring._parse(ring._pack(Message(TOKENS, 2, 5, 1, batch, ids))[0])
    assert msg.payload is not None and torch.equal(msg.payload, ids)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("host_headers", [False, True])
def test_each_link_has_a_group_of_its_own_made_in_one_order_on_every_rank(
    world: int, host_headers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No two links share a process group (so no communicator, whatever torch does with a group's
    point-to-point operations), and every rank makes every group in the same order: new_group is collective."""
    from ppscope.engine import comm

    made: list[tuple[tuple[int, ...], str | None]] = []

    def new_group(ranks: list[int], backend: str | None = None) -> int:
        made.append((tuple(ranks), backend))
        return len(made) - 1  # the group, as its index in `made`

    monkeypatch.setattr(comm.dist, "new_group", new_group)
    monkeypatch.setattr(comm.Ring, "_warm_links", lambda self: None)
    monkeypatch.setattr(comm.Ring, "_post_header", lambda self: None)
    sequences = []
    for rank in range(world):
        made.clear()
        ring = Ring(
            rank, world, Recorder(None, rank=rank, stage=rank), 2, torch.device("cpu"), 5, host_headers=host_headers
        )
        ring.start()
        ring.close()
        sequences.append(list(made))
        prev, succ = (rank - 1) % world, (rank + 1) % world
        for header in (False, True):
            into, out = ring._group(prev, header), ring._group(rank, header)
            assert into != out
            assert made[into] == ((prev, rank), "gloo" if header and host_headers else None)
            assert made[out] == ((rank, succ), "gloo" if header and host_headers else None)
    assert all(seq == sequences[0] for seq in sequences)
    assert len(sequences[0]) == world * (2 if host_headers else 1)

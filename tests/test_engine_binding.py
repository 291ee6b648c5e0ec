"""Which GPU a rank takes and the one backend every rank uses, decided on rank 0 from every rank's GPU: with a
stand-in torch.cuda and an in-process store shared by ranks run as threads."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist
from error_helpers import raises_code

from ppscope.engine.binding import agree_backend, decide_backend, device_for
from ppscope.errors import ErrorCode, InvalidConfigError


@pytest.mark.parametrize(
    ("requested", "gpus", "expected"),
    [
        ("auto", ["a", "b", "c"], "nccl"),
        ("nccl", ["a", "b"], "nccl"),
        ("auto", ["a", "", "c"], "gloo"),  # a node without GPUs: gloo everywhere, not NCCL on some nodes
        ("auto", ["a", "a"], "gloo"),  # two ranks would share one GPU
        ("gloo", ["a", "b"], "gloo"),
        ("nccl", ["a", "", ""], "rank 1 sees none (2 of 3 ranks without one)"),
        ("nccl", ["a", "b", "a"], "ranks 0 and 2 would share GPU a"),
    ],
)
def test_nccl_needs_a_gpu_of_its_own_for_every_rank(requested: str, gpus: list[str], expected: str) -> None:
    if expected in ("nccl", "gloo"):
        assert decide_backend(requested, gpus) == expected
    else:
        with raises_code(InvalidConfigError, ErrorCode.NO_GPU):
            decide_backend(requested, gpus)


def _agree(requested: str, gpus: list[str]) -> list[str | InvalidConfigError]:
    """What each rank (a thread) gets from agree_backend, or the error it raises."""
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=20))
    got: list[str | InvalidConfigError] = [""] * len(gpus)

    def rank(r: int) -> None:
        try:
            got[r] = agree_backend(store, r, len(gpus), requested, gpus[r])
        except InvalidConfigError as exc:
            got[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in reversed(range(len(gpus)))]  # rank 0 last
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_every_rank_gets_rank_0s_decision_from_every_rank_s_gpu() -> None:
    assert _agree("auto", ["a", "b", "c", "d"]) == ["nccl"] * 4
    # rank 0's node has GPUs, rank 3's has none: every rank takes gloo (deciding per node would hang)
    assert _agree("auto", ["a", "b", "c", ""]) == ["gloo"] * 4
    said = _agree("nccl", ["a", "b", "a"])
    assert all(isinstance(e, InvalidConfigError) and e.code == ErrorCode.NO_GPU for e in said), said
    assert len({str(e) for e in said}) == 1 and "--backend nccl" in str(said[0]) and "0 and 2" in str(said[0])


class _Cuda:
    def __init__(self, count: int) -> None:
        self.count = count
        self.current = -1

    def set_device(self, index: int) -> None:
        self.current = index


@pytest.mark.parametrize(("count", "local_rank", "index"), [(1, 5, 0), (4, 6, 2), (8, 3, 3)])
def test_a_rank_takes_its_local_rank_modulo_the_gpus_it_sees(
    monkeypatch: pytest.MonkeyPatch, count: int, local_rank: int, index: int
) -> None:
    """One GPU per process (SLURM, Kubernetes): local rank 5 takes GPU 0, its only one; all GPUs shown: its own."""
    cuda = _Cuda(count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda.count)
    monkeypatch.setattr(torch.cuda, "set_device", cuda.set_device)
    assert device_for("nccl", local_rank) == torch.device("cuda", index) and cuda.current == index
    assert device_for("gloo", local_rank) == torch.device("cpu")
    assert device_for("nccl", local_rank, "cpu") == torch.device("cpu")
    cuda.current = -1  # gloo between ranks on GPUs (--device cuda): the same GPU, activations through the host
    assert device_for("gloo", local_rank, "cuda") == torch.device("cuda", index) and cuda.current == index


def test_device_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with raises_code(InvalidConfigError, ErrorCode.NO_GPU):
        device_for("gloo", 1, "cuda")

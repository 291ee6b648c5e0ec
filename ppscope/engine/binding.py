"""Which device each rank runs on, and the one backend every rank of a run uses.

A rank takes GPU `local_rank % device_count()`: the GPU of its local rank where a node shows all its GPUs to
every process, and its only GPU where a scheduler shows each process one (SLURM's `--gpus-per-task=1`,
Kubernetes). Whether the run can use NCCL is decided once, by rank 0, from every rank's GPU: each rank
publishes the UUID of the GPU it would take on the rendezvous store, and rank 0 answers `nccl` when every rank
has a GPU of its own, else `gloo` (or, for `--backend nccl`, a one-line error every rank raises). A decision
made on each node from its own GPUs could differ between nodes, and ranks that disagree on the backend hang
in `init_process_group`.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["agree_backend", "decide_backend", "device_for", "gpu_ordinal", "gpu_uuid", "rendezvous", "run_store"]

_GPU_KEY = "gpu/{}"
_BACKEND_KEY = "backend"
_ERROR = "error:"


def gpu_ordinal(local_rank: int) -> int | None:
    """The CUDA ordinal of the GPU this rank takes, None when this process sees no GPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return local_rank % count if count else None


def gpu_uuid(local_rank: int) -> str:
    """The UUID of the GPU this rank would take, empty when it sees none."""
    ordinal = gpu_ordinal(local_rank)
    return "" if ordinal is None else str(torch.cuda.get_device_properties(ordinal).uuid)


def device_for(backend: str, local_rank: int, device: str = "auto") -> torch.device:
    """This rank's device (made current): its GPU with NCCL or `device` cuda (gloo then carries activations
    through host memory, and ranks may share a GPU), else the CPU."""
    ordinal = gpu_ordinal(local_rank) if device == "cuda" or (backend == "nccl" and device == "auto") else None
    if ordinal is None:
        if device == "cuda":
            raise InvalidConfigError(
                ErrorCode.NO_GPU, f"--device cuda: local rank {local_rank} sees no GPU; use --device cpu"
            )
        return torch.device("cpu")
    torch.cuda.set_device(ordinal)
    return torch.device("cuda", ordinal)


def decide_backend(requested: str, gpus: list[str]) -> str:
    """The run's backend from `requested` and every rank's GPU UUID (empty: none). NCCL needs a GPU for each
    rank, never one shared by two (a GPU can serve one rank of a communicator)."""
    if requested == "gloo":
        return "gloo"
    missing = [r for r, uuid in enumerate(gpus) if not uuid]
    first: dict[str, int] = {}
    shared = None
    for r, uuid in enumerate(gpus):
        if uuid and shared is None and uuid in first:
            shared = (first[uuid], r, uuid)
        first.setdefault(uuid, r)
    if not missing and shared is None:
        return "nccl"
    if requested == "auto":
        return "gloo"
    if missing:
        raise InvalidConfigError(
            ErrorCode.NO_GPU,
            f"--backend nccl needs a GPU for every rank, and rank {missing[0]} sees none "
            f"({len(missing)} of {len(gpus)} ranks without one); use --backend gloo",
        )
    assert shared is not None
    a, b, uuid = shared
    raise InvalidConfigError(
        ErrorCode.NO_GPU,
        f"--backend nccl needs a GPU per rank, and ranks {a} and {b} would share GPU {uuid}: show each node's "
        "processes as many GPUs as it runs ranks, or each process one of its own; or use --backend gloo",
    )


def agree_backend(store: Any, rank: int, world: int, requested: str, uuid: str) -> str:
    """The backend rank 0 decides from every rank's GPU (`decide_backend`), the same on every rank. `store`:
    this run's keys of the rendezvous store (`run_store`); a wait for rank 0 ends at the store's timeout."""
    if requested == "gloo":
        return "gloo"
    store.set(_GPU_KEY.format(rank), uuid)
    if rank == 0:
        gpus = [_text(store.get(_GPU_KEY.format(r))) for r in range(world)]
        try:
            decided = decide_backend(requested, gpus)
        except InvalidConfigError as exc:
            decided = f"{_ERROR}{exc.code}:{exc}"  # the code travels with the message to the other ranks
        store.set(_BACKEND_KEY, decided)
    else:
        decided = _text(store.get(_BACKEND_KEY))
    if decided.startswith(_ERROR):
        code, message = decided[len(_ERROR) :].split(":", 1)
        raise InvalidConfigError(ErrorCode(code), message)
    return decided


def rendezvous(rank: int, world: int, timeout_s: float) -> Any:
    """The run's store, as `init_process_group` would make it from the environment (MASTER_ADDR and
    MASTER_PORT; under torchrun, its agent's store)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    return store


def run_store(store: Any) -> Any:
    """ppscope's keys of the rendezvous store, apart from torch's and from an earlier attempt's (torchrun's
    agent keeps its store across restarts)."""
    return dist.PrefixStore(f"ppscope/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

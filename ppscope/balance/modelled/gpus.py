"""Accelerators by their published figures: memory, memory bandwidth, dense BF16 and FP8 peaks, interconnect,
and the share of those peaks real kernels were measured to reach.

The cost model (`ppscope.balance.modelled.roofline`) divides bytes by the achieved memory bandwidth and FLOPs
by an achieved peak from here. Every datasheet figure is from the vendor's datasheet named in `source`; peaks
are dense (NVIDIA's datasheets print tensor-core figures with 2:4 sparsity, twice the dense rate, and the
dense figure is that ÷ 2). Memory is kept twice: `memory_gb`, the datasheet's GB, for display, and
`memory_gib`, the capacity the driver reports (nvidia-smi, rocm-smi), which the planner budgets. The
achieved shares (`Achieved`) are fitted per GPU family to one published measurement each and checked on
another (see the note on achieved efficiency in docs/ARCHITECTURE.md); where none is published the factor is
1 and says so. This module knows nothing about models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["DEFAULT_GPU", "GPU", "GPUS", "NO_MEASUREMENT", "PEAK", "Achieved", "gpu_named"]

DEFAULT_GPU = "h100-sxm"
"""The GPU a trace is calibrated with when none is given: calibration keeps only the model's shape."""

MIB = 1 << 20
GIB = 1 << 30
NO_MEASUREMENT = "datasheet peak, no published measurement"
"""What a factor of 1 says where nothing published measures the family."""


@dataclass(frozen=True, kw_only=True)
class Achieved:
    """Shares of the datasheet peaks that real kernels reach on a GPU family, each with where it comes from."""

    memory: float = 1.0
    """Memory bandwidth reached in batch-1 decode ÷ the datasheet's."""
    memory_source: str = NO_MEASUREMENT
    compute: float = 1.0
    """Dense tensor FLOP/s reached ÷ the datasheet's."""
    compute_source: str = NO_MEASUREMENT
    link: float = 1.0
    """Interconnect bandwidth reached ÷ the datasheet's."""
    link_source: str = NO_MEASUREMENT

    def __post_init__(self) -> None:
        for name in ("memory", "compute", "link"):
            if not 0 < getattr(self, name) <= 1:
                raise InvalidConfigError(
                    ErrorCode.BAD_VALUE, f"an achieved share must be in (0, 1], got {name}={getattr(self, name)}"
                )


_AT_PEAK = "datasheet peak, as asked (--peak, or a calibration on a trace, whose scale replaces the shares)"
PEAK = Achieved(memory_source=_AT_PEAK, compute_source=_AT_PEAK, link_source=_AT_PEAK)
"""Every part at the datasheet's peak: what `--peak` asks for, and what a calibration on a trace scales."""


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One accelerator's published figures and the shares of them kernels reach."""

    name: str
    """The name `--gpu` takes."""
    family: str
    """Architecture (Hopper, Ampere, ...): the achieved shares are fitted per family."""
    memory_gb: float
    """Memory, GB as the datasheet prints it: for display only."""
    memory_gib: float
    """Memory the driver reports, GiB (nvidia-smi's MiB ÷ 1024): what the planner budgets."""
    memory_gib_source: str
    """Where `memory_gib` comes from."""
    memory_tb_per_s: float
    """Memory bandwidth, TB/s (10^12 bytes per second)."""
    bf16_tflops: float
    """Dense BF16/FP16 tensor peak, TFLOPS (10^12 FLOP per second)."""
    fp8_tflops: float | None
    """Dense FP8 tensor peak, TFLOPS; None where the chip has no FP8 tensor cores."""
    link_gb_per_s: float
    """Interconnect bandwidth in each direction, GB/s (half the bidirectional figure datasheets print): per GPU
    through a switch, per peer link in a mesh."""
    link: str
    """Which interconnect `link_gb_per_s` is."""
    topology: str = "switch"
    """`switch`: every peer gets `link_gb_per_s` (NVSwitch, or one PCIe slot's share); `mesh`: one link of
    `link_gb_per_s` to each of `peer_links` peers (AMD Infinity Fabric), so a collective among T GPUs uses T - 1."""
    peer_links: int = 1
    """Direct links to other GPUs (mesh only)."""
    source: str
    """The datasheet the figures come from, and the arithmetic from what it prints."""
    achieved: Achieved = PEAK
    """Shares of the peaks real kernels reach; `at_peak()` sets them to 1."""

    def __post_init__(self) -> None:
        if self.topology not in ("switch", "mesh"):
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"GPU {self.name}: topology is switch or mesh, not {self.topology!r}"
            )

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for weights of `dtype`: FP8 where the chip has it (else the BF16 peak: FP8 weights
        are then widened to BF16, as weight-only kernels do), BF16 for fp16 and bf16."""
        kind = dtype.strip().lower()
        if kind == "fp8":
            return (self.fp8_tflops or self.bf16_tflops) * 1e12
        if kind in ("fp16", "float16", "bf16", "bfloat16"):
            return self.bf16_tflops * 1e12
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CHOICE,
            f"the GPU table has BF16 and FP8 peaks, not {dtype}: give --dtype bf16, fp16 or fp8 with --gpu",
        )

    def achieved_flops(self, dtype: str) -> float:
        """The dense FLOP/s kernels reach at `dtype`: the peak × the family's compute share."""
        return self.peak_flops(dtype) * self.achieved.compute

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth kernels reach, bytes per second: the datasheet's × the family's memory share."""
        return self.memory_tb_per_s * 1e12 * self.achieved.memory

    def peer_bandwidth(self, peers: int) -> float:
        """Bytes per second each way one GPU can send to `peers` others at once: the switch port's whole
        bandwidth, or in a mesh one link per peer (a pipeline hop or a TP=2 all-reduce: one link), × the
        family's link share."""
        links = 1 if self.topology == "switch" else max(1, min(peers, self.peer_links))
        return self.link_gb_per_s * 1e9 * links * self.achieved.link

    @property
    def link_bandwidth(self) -> float:
        """Bandwidth to one peer in each direction, bytes per second (`peer_bandwidth(1)`)."""
        return self.peer_bandwidth(1)

    @property
    def memory_bytes(self) -> int:
        """The driver's capacity, bytes."""
        return int(self.memory_gib * GIB)

    def at_peak(self) -> GPU:
        """This GPU with every achieved share 1: the datasheet's peaks (`--peak`)."""
        return dataclasses.replace(self, achieved=PEAK)


def _smi(mib: int, what: str) -> tuple[float, str]:
    """A capacity nvidia-smi prints in MiB, as GiB, and its source."""
    return mib / 1024, f"nvidia-smi on {what}: {mib:,} MiB"


_NVLINK4 = "NVLink 4: 900 GB/s bidirectional per GPU through NVSwitch"
_PCIE4 = "PCIe Gen4 x16: 64 GB/s bidirectional (no NVLink)"
_PCIE5 = "PCIe Gen5 x16: 128 GB/s bidirectional"

# Achieved memory bandwidth per family: the model's batch-1 decode time at the datasheet peak ÷ a published
# measured time of the same decode (see the note on achieved efficiency in docs/ARCHITECTURE.md, which also
# gives each factor's check on a measurement it was not fitted to).
HOPPER = Achieved(
    memory=0.569,
    memory_source="fitted to Llama-3.1-8B bf16 batch-1 decode on an H100 at 126.90 tok/s (7.88 ms/token; "
    "pytorch/ao torchao/quantization/README.md, CUDA backend NVIDIA-H100 table), carried to every Hopper part",
)
AMPERE = Achieved(
    memory=0.705,
    memory_source="fitted to Llama-3-8B bf16 batch-1 decode on an A100-80GB at 95.64 tok/s (10.46 ms/token; "
    "pytorch/ao torchao/quantization/README.md, NVIDIA-A100-80GB table), carried to every Ampere part",
)
ADA = Achieved()
BLACKWELL = Achieved()
CDNA3 = Achieved()


def _row(*, memory_mib: int, smi: str, **fields: Any) -> GPU:
    """A GPU whose driver capacity is nvidia-smi's `memory_mib` on the part `smi` names."""
    gib, where = _smi(memory_mib, smi)
    return GPU(memory_gib=gib, memory_gib_source=where, **fields)


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        _row(
            name="h100-sxm",
            family="Hopper",
            memory_gb=80,
            memory_mib=81_559,
            smi="NVIDIA H100 80GB HBM3",
            memory_tb_per_s=3.35,
            bf16_tflops=989.5,
            fp8_tflops=1979,
            link_gb_per_s=450,
            link=_NVLINK4,
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 and FP8 3,958 TFLOPS with "
            "sparsity (dense: half), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="h100-pcie",
            family="Hopper",
            memory_gb=80,
            memory_mib=81_559,
            smi="NVIDIA H100 PCIe",
            memory_tb_per_s=2.0,
            bf16_tflops=756.5,
            fp8_tflops=1513,
            link_gb_per_s=64,
            link=_PCIE5 + " (an NVLink bridge joins pairs at 600 GB/s; not assumed)",
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16 1,513 and FP8 3,026 TFLOPS with "
            "sparsity (dense: half), 80 GB HBM2e at 2 TB/s, PCIe Gen5 128 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="h100-nvl",
            family="Hopper",
            memory_gb=94,
            memory_mib=95_830,
            smi="NVIDIA H100 NVL",
            memory_tb_per_s=3.9,
            bf16_tflops=835.5,
            fp8_tflops=1670.5,
            link_gb_per_s=64,
            link=_PCIE5 + " (an NVLink bridge joins pairs at 600 GB/s; not assumed)",
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: BF16 1,671 and FP8 3,341 TFLOPS with "
            "sparsity (dense: half), 94 GB HBM3 at 3.9 TB/s, NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="h200",
            family="Hopper",
            memory_gb=141,
            memory_mib=143_771,
            smi="NVIDIA H200",
            memory_tb_per_s=4.8,
            bf16_tflops=989.5,
            fp8_tflops=1979,
            link_gb_per_s=450,
            link=_NVLINK4,
            source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 and FP8 3,958 TFLOPS with "
            "sparsity (dense: half), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="h200-nvl",
            family="Hopper",
            memory_gb=141,
            memory_mib=143_771,
            smi="NVIDIA H200 NVL",
            memory_tb_per_s=4.8,
            bf16_tflops=835.5,
            fp8_tflops=1670.5,
            link_gb_per_s=64,
            link=_PCIE5 + " (2- or 4-way NVLink bridges at 900 GB/s; not assumed)",
            source="NVIDIA H200 Tensor Core GPU datasheet, H200 NVL: BF16 1,671 and FP8 3,341 TFLOPS with "
            "sparsity (dense: half), 141 GB HBM3e at 4.8 TB/s, NVLink bridge 900 GB/s, PCIe Gen5 128 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="h20",
            family="Hopper",
            memory_gb=96,
            memory_mib=97_871,
            smi="NVIDIA H20",
            memory_tb_per_s=4.0,
            bf16_tflops=148,
            fp8_tflops=296,
            link_gb_per_s=450,
            link=_NVLINK4,
            source="NVIDIA H20 product brief as distributed to partners (no public datasheet): BF16 148 and FP8 "
            "296 TFLOPS dense, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s",
            achieved=HOPPER,
        ),
        _row(
            name="a100-40gb",
            family="Ampere",
            memory_gb=40,
            memory_mib=40_960,
            smi="NVIDIA A100-SXM4-40GB",
            memory_tb_per_s=1.555,
            bf16_tflops=312,
            fp8_tflops=None,
            link_gb_per_s=300,
            link="NVLink 3: 600 GB/s bidirectional per GPU through NVSwitch",
            source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM: BF16 312 TFLOPS dense (624 with "
            "sparsity), no FP8, 40 GB HBM2 at 1,555 GB/s, NVLink 600 GB/s",
            achieved=AMPERE,
        ),
        _row(
            name="a100-80gb",
            family="Ampere",
            memory_gb=80,
            memory_mib=81_920,
            smi="NVIDIA A100-SXM4-80GB",
            memory_tb_per_s=2.039,
            bf16_tflops=312,
            fp8_tflops=None,
            link_gb_per_s=300,
            link="NVLink 3: 600 GB/s bidirectional per GPU through NVSwitch",
            source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: BF16 312 TFLOPS dense (624 with "
            "sparsity), no FP8, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s",
            achieved=AMPERE,
        ),
        _row(
            name="l40s",
            family="Ada",
            memory_gb=48,
            memory_mib=46_068,
            smi="NVIDIA L40S",
            memory_tb_per_s=0.864,
            bf16_tflops=362.05,
            fp8_tflops=733,
            link_gb_per_s=32,
            link=_PCIE4,
            source="NVIDIA L40S datasheet: BF16 362.05 and FP8 733 TFLOPS dense (733 and 1,466 with sparsity), "
            "48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 64 GB/s",
            achieved=ADA,
        ),
        _row(
            name="l4",
            family="Ada",
            memory_gb=24,
            memory_mib=23_034,
            smi="NVIDIA L4",
            memory_tb_per_s=0.3,
            bf16_tflops=121,
            fp8_tflops=242.5,
            link_gb_per_s=32,
            link=_PCIE4,
            source="NVIDIA L4 Tensor Core GPU datasheet: BF16 242 and FP8 485 TFLOPS with sparsity (dense: "
            "half), 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16 64 GB/s",
            achieved=ADA,
        ),
        _row(
            name="b200",
            family="Blackwell",
            memory_gb=180,
            memory_mib=183_359,
            smi="NVIDIA B200",
            memory_tb_per_s=7.7,
            bf16_tflops=2250,
            fp8_tflops=4500,
            link_gb_per_s=900,
            link="NVLink 5: 1.8 TB/s bidirectional per GPU through NVSwitch",
            source="NVIDIA Blackwell datasheet, HGX B200 column, per GPU (the 8-GPU board's figures ÷ 8): BF16 36 "
            "and FP8 72 PFLOPS with sparsity → 2.25 and 4.5 PFLOPS dense, 1.44 TB HBM3e → 180 GB; 7.7 TB/s "
            "per GPU (the DGX B200's 64 TB/s ÷ 8 = 8 TB/s is the system's figure); NVLink 1.8 TB/s",
            achieved=BLACKWELL,
        ),
        GPU(
            name="mi300x",
            family="CDNA3",
            memory_gb=192,
            memory_gib=205_822_885_888 / GIB,
            memory_gib_source="rocm-smi --showmeminfo vram on an AMD Instinct MI300X: 205,822,885,888 B",
            memory_tb_per_s=5.3,
            bf16_tflops=1307.4,
            fp8_tflops=2614.9,
            link_gb_per_s=64,
            link="AMD Infinity Fabric: a full mesh, one xGMI link of 128 GB/s bidirectional to each of 7 peers "
            "(896 GB/s in all)",
            topology="mesh",
            peer_links=7,
            source="AMD Instinct MI300X data sheet: BF16 1,307.4 and FP8 2,614.9 TFLOPS dense (2,614.9 and "
            "5,229.8 with sparsity), 192 GB HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s (896 GB/s)",
            achieved=CDNA3,
        ),
    )
}
"""Every GPU `--gpu` takes, by name."""

_ALIASES = {
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "a100": "a100-80gb",
    "h200-sxm": "h200",
    "h100nvl": "h100-nvl",
    "h200nvl": "h200-nvl",
}


def gpu_named(name: str) -> GPU:
    """The GPU called `name` (case, spaces and underscores aside; `h100` is the SXM part, `a100` the 80 GB
    one); an unknown name is refused with the list of known ones."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    raise InvalidConfigError(
        ErrorCode.UNKNOWN_CHOICE,
        f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)} (datasheet figures in ppscope/balance/modelled/gpus.py)",
    )

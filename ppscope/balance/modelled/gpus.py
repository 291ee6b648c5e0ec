"""Accelerators by their datasheet figures: memory, memory bandwidth, dense BF16 and FP8 peaks, interconnect.

The cost model (`ppscope.balance.modelled.roofline`) divides bytes by `memory_tb_s` and FLOPs by a peak from here.
Every figure is from the vendor's published datasheet named in `source`, written down without network access;
peaks are dense (NVIDIA's datasheets print tensor-core figures with 2:4 sparsity, twice the dense rate, and
the dense figure is that ÷ 2). They are peaks: real kernels reach a fraction of them (decode often 60-85% of
the bandwidth), which scales every part of the model alike. This module knows nothing about models.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppscope.errors import InvalidConfigError

__all__ = ["DEFAULT_GPU", "GPU", "GPUS", "gpu_named"]

DEFAULT_GPU = "h100-sxm"
"""The GPU a trace is calibrated with when none is given: calibration keeps only the model's shape."""


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One accelerator's datasheet figures."""

    name: str
    """The name `--gpu` takes."""
    memory_gb: float
    """Memory, GB as the datasheet prints it (HBM is sized in binary units: an 80 GB H100 reports 79.6 GiB)."""
    memory_tb_s: float
    """Memory bandwidth, TB/s (10^12 bytes per second)."""
    bf16_tflops: float
    """Dense BF16/FP16 tensor peak, TFLOPS (10^12 FLOP per second)."""
    fp8_tflops: float | None
    """Dense FP8 tensor peak, TFLOPS; None where the chip has no FP8 tensor cores."""
    link_gb_s: float
    """Interconnect bandwidth per GPU in each direction, GB/s (half the bidirectional figure datasheets print)."""
    link: str
    """Which interconnect `link_gb_s` is."""
    source: str
    """The datasheet the figures come from, and the arithmetic from what it prints."""

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for weights of `dtype`: FP8 where the chip has it (else the BF16 peak: FP8 weights
        are then widened to BF16, as weight-only kernels do), BF16 for fp16 and bf16."""
        kind = dtype.strip().lower()
        if kind == "fp8":
            return (self.fp8_tflops or self.bf16_tflops) * 1e12
        if kind in ("fp16", "float16", "bf16", "bfloat16"):
            return self.bf16_tflops * 1e12
        raise InvalidConfigError(
            f"the GPU table has BF16 and FP8 peaks, not {dtype}: give --dtype bf16, fp16 or fp8 with --gpu"
        )

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth, bytes per second."""
        return self.memory_tb_s * 1e12

    @property
    def link_bandwidth(self) -> float:
        """Interconnect bandwidth in each direction, bytes per second."""
        return self.link_gb_s * 1e9


_NVLINK4 = "NVLink 4: 900 GB/s bidirectional per GPU"
_PCIE4 = "PCIe Gen4 x16: 64 GB/s bidirectional (no NVLink)"

GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU(
            name="h100-sxm",
            memory_gb=80,
            memory_tb_s=3.35,
            bf16_tflops=989.5,
            fp8_tflops=1979,
            link_gb_s=450,
            link=_NVLINK4,
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 and FP8 3,958 TFLOPS with "
            "sparsity (dense: half), 3.35 TB/s HBM3, NVLink 900 GB/s",
        ),
        GPU(
            name="h100-pcie",
            memory_gb=80,
            memory_tb_s=2.0,
            bf16_tflops=756.5,
            fp8_tflops=1513,
            link_gb_s=64,
            link="PCIe Gen5 x16: 128 GB/s bidirectional (an NVLink bridge joins pairs at 600 GB/s; not assumed)",
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16 1,513 and FP8 3,026 TFLOPS with "
            "sparsity (dense: half), 2 TB/s HBM2e, PCIe Gen5 128 GB/s",
        ),
        GPU(
            name="h200",
            memory_gb=141,
            memory_tb_s=4.8,
            bf16_tflops=989.5,
            fp8_tflops=1979,
            link_gb_s=450,
            link=_NVLINK4,
            source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 and FP8 3,958 TFLOPS with "
            "sparsity (dense: half), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s",
        ),
        GPU(
            name="a100-40gb",
            memory_gb=40,
            memory_tb_s=1.555,
            bf16_tflops=312,
            fp8_tflops=None,
            link_gb_s=300,
            link="NVLink 3: 600 GB/s bidirectional per GPU",
            source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM: BF16 312 TFLOPS dense (624 with "
            "sparsity), no FP8, 1,555 GB/s HBM2, NVLink 600 GB/s",
        ),
        GPU(
            name="a100-80gb",
            memory_gb=80,
            memory_tb_s=2.039,
            bf16_tflops=312,
            fp8_tflops=None,
            link_gb_s=300,
            link="NVLink 3: 600 GB/s bidirectional per GPU",
            source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: BF16 312 TFLOPS dense (624 with "
            "sparsity), no FP8, 2,039 GB/s HBM2e, NVLink 600 GB/s",
        ),
        GPU(
            name="l40s",
            memory_gb=48,
            memory_tb_s=0.864,
            bf16_tflops=362.05,
            fp8_tflops=733,
            link_gb_s=32,
            link=_PCIE4,
            source="NVIDIA L40S datasheet: BF16 362.05 and FP8 733 TFLOPS dense (733 and 1,466 with sparsity), "
            "48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 64 GB/s",
        ),
        GPU(
            name="l4",
            memory_gb=24,
            memory_tb_s=0.3,
            bf16_tflops=121,
            fp8_tflops=242.5,
            link_gb_s=32,
            link=_PCIE4,
            source="NVIDIA L4 Tensor Core GPU datasheet: BF16 242 and FP8 485 TFLOPS with sparsity (dense: "
            "half), 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16 64 GB/s",
        ),
        GPU(
            name="b200",
            memory_gb=180,
            memory_tb_s=8.0,
            bf16_tflops=2250,
            fp8_tflops=4500,
            link_gb_s=900,
            link="NVLink 5: 1.8 TB/s bidirectional per GPU",
            source="NVIDIA HGX B200 datasheet, per GPU (the 8-GPU board's figures ÷ 8): BF16 36 and FP8 72 "
            "PFLOPS with sparsity → 2.25 and 4.5 PFLOPS dense, 1.44 TB HBM3e at 64 TB/s → 180 GB at "
            "8 TB/s, NVLink 1.8 TB/s",
        ),
        GPU(
            name="mi300x",
            memory_gb=192,
            memory_tb_s=5.3,
            bf16_tflops=1307.4,
            fp8_tflops=2614.9,
            link_gb_s=448,
            link="AMD Infinity Fabric: 7 links x 128 GB/s = 896 GB/s bidirectional per GPU",
            source="AMD Instinct MI300X data sheet: BF16 1,307.4 and FP8 2,614.9 TFLOPS dense (2,614.9 and "
            "5,229.8 with sparsity), 192 GB HBM3 at 5.3 TB/s, Infinity Fabric 896 GB/s",
        ),
    )
}
"""Every GPU `--gpu` takes, by name."""

_ALIASES = {"h100": "h100-sxm", "h100-sxm5": "h100-sxm", "a100": "a100-80gb", "h200-sxm": "h200"}


def gpu_named(name: str) -> GPU:
    """The GPU called `name` (case, spaces and underscores aside; `h100` is the SXM part, `a100` the 80 GB
    one); an unknown name is refused with the list of known ones."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    raise InvalidConfigError(
        f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)} (datasheet figures in ppscope/balance/modelled/gpus.py)"
    )

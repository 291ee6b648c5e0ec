"""Load a Hugging Face Llama-format checkpoint (`config.json` + `*.safetensors`) layer by layer.

Each rank asks only for its own layers (and the embedding or head if it holds an end), and only those
tensors are read from disk (`safe_open` reads by name). Names follow `LlamaForCausalLM`. A sharded
checkpoint's index says which shard holds what; without one, every `*.safetensors` file's header is read.

`check_checkpoint` refuses, before any process starts, a checkpoint the ranks could not load: it reads only
the headers of the files they will open and checks every tensor the model needs against its config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Container
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ppscope.balance.modelled.shapes import ModelShape
from ppscope.engine.model import DecoderLayer, Embedding, Head
from ppscope.errors import CorruptFileError, ErrorCode, UnsupportedInputError

__all__ = ["FLOAT_BITS", "INDEX", "CheckpointSource", "check_checkpoint", "needed_tensors", "read_header"]

INDEX = "model.safetensors.index.json"
"""A sharded checkpoint's map from tensor name to shard file."""
FLOAT_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "F8_E4M3": 8, "F8_E5M2": 8}
"""safetensors' floating-point dtypes the engine reads (as float32), and their bits per element."""
_DTYPE_BITS = FLOAT_BITS | {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "U16": 16,
    "I16": 16,
    "U32": 32,
    "I32": 32,
    "U64": 64,
    "I64": 64,
}
_MAX_HEADER = 100_000_000
"""The largest header safetensors reads."""


class CheckpointSource:
    synthetic = False

    def __init__(self, directory: str | Path, shape: ModelShape) -> None:
        self.dir = Path(directory)
        self.shape = shape
        index = self.dir / INDEX
        self._where = self._from_index(index) if index.is_file() else self._from_files()
        self.tensors_read = 0

    def _from_index(self, index: Path) -> dict[str, Path]:
        """Where each tensor is, from a sharded checkpoint's index: no shard is opened to find out, and files
        it does not list (another format's copy of the weights, say) are never read."""
        return _read_index(index)

    def _from_files(self) -> dict[str, Path]:
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise UnsupportedInputError(
                ErrorCode.CHECKPOINT_INCOMPLETE,
                f"{self.dir} holds no *.safetensors files: give a Hugging Face checkpoint",
            )
        where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                    where[key] = f
        return where

    def _load(self, module: nn.Module, prefix: str, rename: dict[str, str] | None = None) -> nn.Module:
        """Fill `module` (built on the meta device) with the tensors under `prefix`, reading only those."""
        state = {}
        by_file: dict[Path, list[tuple[str, str]]] = {}
        for name, _ in module.named_parameters():
            key = (rename or {}).get(name, prefix + name)
            if key not in self._where:
                raise UnsupportedInputError(
                    ErrorCode.CHECKPOINT_INCOMPLETE, f"{self.dir}: tensor {key} is missing from the checkpoint"
                )
            by_file.setdefault(self._where[key], []).append((name, key))
        for path, names in by_file.items():
            with safe_open(str(path), framework="pt") as st:
                for name, key in names:
                    state[name] = st.get_tensor(key).to(torch.float32)
                    self.tensors_read += 1
        module.load_state_dict(state, strict=True, assign=True)
        return module

    def layer(self, index: int) -> nn.Module:
        with torch.device("meta"):
            layer = DecoderLayer(self.shape)
        return self._load(layer, f"model.layers.{index}.")

    def embedding(self) -> nn.Module:
        with torch.device("meta"):
            emb = Embedding(self.shape)
        return self._load(emb, "model.")

    def head(self) -> nn.Module:
        with torch.device("meta"):
            head = Head(self.shape)
        return self._load(head, "", _head_names(self.shape, self._where))


def _head_names(shape: ModelShape, names: Container[str]) -> dict[str, str]:
    """The checkpoint's names of the head's parameters: the embedding stands in for a tied or absent LM head."""
    lm = "lm_head.weight"
    if lm not in names or shape.tie_embeddings:
        lm = "model.embed_tokens.weight"
    return {"norm.weight": "model.norm.weight", "lm_head.weight": lm}


def _read_index(index: Path) -> dict[str, Path]:
    directory = index.parent
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        where = {str(k): directory / str(v) for k, v in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UnsupportedInputError(
            ErrorCode.CHECKPOINT_MISMATCH, f"{index} is not a safetensors index (no weight_map: {exc})"
        ) from None
    missing = sorted({p.name for p in where.values() if not p.is_file()})
    if missing:
        raise UnsupportedInputError(
            ErrorCode.CHECKPOINT_INCOMPLETE,
            f"{index} lists {len(missing)} shard(s) that are not in {directory}, e.g. {missing[0]}: "
            "download the whole checkpoint",
        )
    return where


def needed_tensors(shape: ModelShape, names: Container[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine loads for the whole model, by its name in the checkpoint, with its shape.
    `names`: the checkpoint's tensor names (whether it has an LM head of its own)."""
    with torch.device("meta"):
        layer, emb, head = DecoderLayer(shape), Embedding(shape), Head(shape)
    need: dict[str, tuple[int, ...]] = {}
    for i in range(shape.layers):
        need.update({f"model.layers.{i}.{n}": tuple(p.shape) for n, p in layer.named_parameters()})
    need.update({f"model.{n}": tuple(p.shape) for n, p in emb.named_parameters()})
    rename = _head_names(shape, names)
    need.update({rename[n]: tuple(p.shape) for n, p in head.named_parameters()})
    return need


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors a safetensors file holds, name -> (dtype, shape), from its header alone (8 bytes giving its
    length, then JSON): no tensor data is read. Anything the loader would refuse raises CorruptFileError."""

    def damaged(what: str) -> CorruptFileError:
        return CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{path} {what}: it is damaged or not a safetensors file; download it again"
        )

    try:
        size = path.stat().st_size
        if size < 8:
            raise damaged("is empty" if size == 0 else f"holds only {size} bytes")
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > min(size - 8, _MAX_HEADER):
                raise damaged(f"starts with a header length of {length} bytes but holds {size - 8} after it")
            raw = f.read(length)
    except OSError as exc:
        raise CorruptFileError(ErrorCode.UNREADABLE_FILE, f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except ValueError:  # UnicodeDecodeError too
        raise damaged("has a header that is not JSON") from None
    if not isinstance(header, dict):
        raise damaged("has a header that is not a JSON object")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, dims, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            valid = isinstance(dtype, str) and all(type(v) is int and v >= 0 for v in [*dims, begin, end])
        except (TypeError, KeyError, ValueError):
            valid = False
        if not valid or end < begin:
            raise damaged(f"describes tensor {name} without a valid dtype, shape and data_offsets")
        bits = _DTYPE_BITS.get(dtype)
        if bits is not None and (end - begin) * 8 != math.prod(dims) * bits:
            raise damaged(f"gives tensor {name} ({dtype} {list(dims)}) {end - begin} bytes")
        tensors[name] = (dtype, tuple(dims))
        spans.append((begin, end, name))
    covered, data = 0, size - 8 - length
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise damaged(f"places tensor {name} at byte {begin} of its data, where {covered} was expected")
        covered = end
    if covered > data:
        raise damaged(f"is truncated: its header describes {covered} bytes of tensors and it holds {data}")
    if covered < data:
        raise damaged(f"has {data - covered} bytes after the {covered} bytes of tensors its header describes")
    return tensors


def check_checkpoint(directory: str | Path, shape: ModelShape) -> None:
    """Refuse, in one line naming the file and the tensor, a checkpoint the ranks could not load: a file that
    is damaged (CorruptFileError), or a tensor the model needs that is missing, of another shape than
    config.json implies, or not floating-point (UnsupportedInputError). Reads only the headers of the files
    the ranks will open: cheap for any size of model."""
    d = Path(directory)
    index = d / INDEX
    headers: dict[Path, dict[str, tuple[str, tuple[int, ...]]]] = {}
    if index.is_file():
        where = _read_index(index)
        lacking = f"{index} lists no tensor"
    else:
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise UnsupportedInputError(
                ErrorCode.CHECKPOINT_INCOMPLETE, f"{d} holds no *.safetensors files: give a Hugging Face checkpoint"
            )
        headers = {f: read_header(f) for f in files}
        where = {name: f for f, tensors in headers.items() for name in tensors}
        lacking = f"{d}: no *.safetensors file holds tensor"
    need = needed_tensors(shape, where)
    unlisted = [k for k in need if k not in where]
    if unlisted:
        raise UnsupportedInputError(
            ErrorCode.CHECKPOINT_INCOMPLETE,
            f"{lacking} {unlisted[0]} ({len(unlisted)} needed tensor(s) missing), which a {shape.layers}-layer "
            "model needs: the checkpoint is incomplete or config.json does not match it",
        )
    if not headers:  # through the index: only the shards that hold a needed tensor
        headers = {f: read_header(f) for f in sorted(set(where[k] for k in need))}
    for key, want in need.items():
        file = where[key]
        if key not in headers[file]:
            raise UnsupportedInputError(
                ErrorCode.CHECKPOINT_MISMATCH,
                f"{file} holds no tensor {key}, which {INDEX} places there: the index does not match its shards; "
                "download the checkpoint again",
            )
        dtype, dims = headers[file][key]
        if dims != want:
            raise UnsupportedInputError(
                ErrorCode.CHECKPOINT_MISMATCH,
                f"{file}: tensor {key} has shape {list(dims)} but config.json implies {list(want)}: the weights "
                "do not match config.json",
            )
        if dtype not in FLOAT_BITS:
            raise UnsupportedInputError(
                ErrorCode.UNSUPPORTED_CHECKPOINT,
                f"{file}: tensor {key} is {dtype}, not a floating-point type: the engine reads "
                f"{', '.join(FLOAT_BITS)} weights (not quantized ones)",
            )

"""Load a Hugging Face Llama-format checkpoint (`config.json` + `*.safetensors`) layer by layer.

Each rank asks only for its own layers (and the embedding or head if it holds an end), and only those
tensors are read from disk (`safe_open` reads by name). Names follow `LlamaForCausalLM`. A sharded
checkpoint's index says which shard holds what; without one, every `*.safetensors` file's header is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.model import DecoderLayer, Embedding, Head
from ppscope.errors import UnsupportedInputError
from ppscope.models import ModelShape

__all__ = ["INDEX", "CheckpointSource"]

INDEX = "model.safetensors.index.json"
"""A sharded checkpoint's map from tensor name to shard file."""


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
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            where = {str(k): self.dir / str(v) for k, v in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnsupportedInputError(f"{index} is not a safetensors index (no weight_map: {exc})") from None
        missing = sorted({p.name for p in where.values() if not p.is_file()})
        if missing:
            raise UnsupportedInputError(
                f"{index} lists {len(missing)} shard(s) that are not in {self.dir}, e.g. {missing[0]}: "
                "download the whole checkpoint"
            )
        return where

    def _from_files(self) -> dict[str, Path]:
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise UnsupportedInputError(f"{self.dir} holds no *.safetensors files: give a Hugging Face checkpoint")
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
                raise UnsupportedInputError(f"{self.dir}: tensor {key} is missing from the checkpoint")
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
        lm = "lm_head.weight"
        if lm not in self._where or self.shape.tie_embeddings:
            lm = "model.embed_tokens.weight"
        return self._load(head, "", {"norm.weight": "model.norm.weight", "lm_head.weight": lm})

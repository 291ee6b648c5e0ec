"""Load a Hugging Face Llama-format checkpoint (`config.json` + `*.safetensors`) layer by layer.

Each rank asks only for its own layers (and the embedding or head if it holds an end), and only those
tensors are read from disk (`safe_open` reads by name). Names follow `LlamaForCausalLM`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.model import DecoderLayer, Embedding, Head
from ppscope.errors import UnsupportedInputError
from ppscope.models import ModelShape

__all__ = ["CheckpointSource"]


class CheckpointSource:
    synthetic = False

    def __init__(self, directory: str | Path, shape: ModelShape) -> None:
        self.dir = Path(directory)
        self.shape = shape
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise UnsupportedInputError(f"{self.dir} holds no *.safetensors files: give a Hugging Face checkpoint")
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                    self._where[key] = f
        self.tensors_read = 0

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

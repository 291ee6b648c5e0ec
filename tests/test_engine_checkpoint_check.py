"""A checkpoint the engine cannot load is refused from its files' headers, in one line naming the file and the
tensor, before any process starts and before the run directory exists."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ppscope.balance.modelled.shapes import ModelShape
from ppscope.cli.main import main
from ppscope.engine.hf import INDEX, check_checkpoint, read_header
from ppscope.errors import CorruptFileError

safetensors_torch = pytest.importorskip("safetensors.torch")
FILE = "model.safetensors"
UP = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    path = tmp_path_factory.mktemp("ckpt") / "whole"
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    model.save_pretrained(path.parent / "sharded", safe_serialization=True, max_shard_size="100KB")
    return path


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


@pytest.fixture
def sharded(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved.parent / "sharded", tmp_path / "sharded"))


def _rewrite(file: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = safetensors_torch.load_file(str(file))
    change(tensors)
    safetensors_torch.save_file(tensors, str(file), metadata={"format": "pt"})


def _set_config(ckpt: Path, **fields: object) -> None:
    config = ckpt / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | fields))


def _refused(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run it: the exit code and the one line said; no run directory was made."""
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--model",
            str(ckpt),
            "--stages",
            "2",
            "--requests",
            "1",
            "--prompt-len",
            "2",
            "--max-new-tokens",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not out.exists()
    return code, err[0]


def test_a_good_checkpoint_passes_whole_or_sharded(ckpt: Path, sharded: Path) -> None:
    shape = ModelShape.from_hf_config(ckpt, exact=True)
    check_checkpoint(ckpt, shape)
    check_checkpoint(sharded, shape)
    (sharded / "consolidated.safetensors").write_bytes(b"another format's copy, never opened")
    check_checkpoint(sharded, shape)  # the index says which files the ranks open


def test_only_headers_are_read(ckpt: Path) -> None:
    """Tensor data is never read: a file whose data is unreadable garbage still passes the check."""
    file = ckpt / FILE
    data = bytearray(file.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = b"\xff" * (len(data) - start)
    file.write_bytes(bytes(data))
    check_checkpoint(ckpt, ModelShape.from_hf_config(ckpt, exact=True))
    assert read_header(file)[UP] == ("F32", (128, 64))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda b: b[:-100], "is truncated: its header describes"),
        (lambda b: b"", "is empty"),
        (lambda b: b"not a safetensors file at all, but long enough", "starts with a header length of"),
        (lambda b: b[:200], "starts with a header length of"),
        (lambda b: b + b"\0" * 8, "has 8 bytes after the"),
        (lambda b: b[:8] + b"[" + b[9:], "has a header that is not JSON"),
    ],
)
def test_damaged_file_is_exit_1_naming_it(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[bytes], bytes], says: str
) -> None:
    file = ckpt / FILE
    file.write_bytes(damage(file.read_bytes()))
    code, line = _refused(ckpt, tmp_path, capsys)
    assert code == CorruptFileError.exit_code == 1
    assert line.startswith(f"ppscope run: error: {file} ") and says in line, line
    assert line.endswith("it is damaged or not a safetensors file; download it again")


def test_no_safetensors_files(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ckpt / FILE).unlink()
    assert _refused(ckpt, tmp_path, capsys) == (
        2,
        f"ppscope run: error: {ckpt} holds no *.safetensors files: give a Hugging Face checkpoint",
    )


def test_a_layer_missing_a_tensor(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.pop(UP))
    code, line = _refused(ckpt, tmp_path, capsys)
    assert code == 2 and f"{ckpt}: no *.safetensors file holds tensor {UP} (1 needed tensor(s) missing)" in line


def test_config_with_more_layers_than_the_file(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _set_config(ckpt, num_hidden_layers=3)
    code, line = _refused(ckpt, tmp_path, capsys)
    assert code == 2 and "holds tensor model.layers.2." in line and "which a 3-layer model needs" in line, line


def test_tensor_of_the_wrong_shape(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.update({UP: torch.zeros(127, 64)}))
    code, line = _refused(ckpt, tmp_path, capsys)
    assert code == 2
    assert line == (
        f"ppscope run: error: {ckpt / FILE}: tensor {UP} has shape [127, 64] but config.json implies "
        "[128, 64]: the weights do not match config.json"
    )


def test_vocab_of_config_and_embedding_differ(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _set_config(ckpt, vocab_size=300)
    code, line = _refused(ckpt, tmp_path, capsys)
    assert (
        code == 2 and "tensor model.embed_tokens.weight has shape [256, 64] but config.json implies [300, 64]" in line
    )


def test_tensor_that_is_not_floating_point(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.update({UP: torch.zeros(128, 64, dtype=torch.int8)}))
    code, line = _refused(ckpt, tmp_path, capsys)
    assert code == 2 and f"tensor {UP} is I8, not a floating-point type" in line


def test_index_places_a_tensor_in_a_shard_that_lacks_it(
    sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = sharded / json.loads((sharded / INDEX).read_text())["weight_map"][UP]
    _rewrite(shard, lambda t: t.pop(UP))
    code, line = _refused(sharded, tmp_path, capsys)
    assert code == 2 and f"{shard} holds no tensor {UP}, which {INDEX} places there" in line


def test_index_that_lacks_a_tensor(sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((sharded / INDEX).read_text())
    del index["weight_map"][UP]
    (sharded / INDEX).write_text(json.dumps(index))
    code, line = _refused(sharded, tmp_path, capsys)
    assert code == 2 and f"{sharded / INDEX} lists no tensor {UP}" in line


def test_damaged_shard_is_named(sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = sharded / json.loads((sharded / INDEX).read_text())["weight_map"][UP]
    shard.write_bytes(shard.read_bytes()[:-4])
    code, line = _refused(sharded, tmp_path, capsys)
    assert code == 1 and line.startswith(f"ppscope run: error: {shard} is truncated")

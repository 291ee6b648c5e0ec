"""A checkpoint the engine cannot load is refused from its files' headers, in one line naming the file and the
tensor, before any process starts and before the run directory exists."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from error_helpers import CliError, cli_error

from ppscope.balance.modelled.shapes import ModelShape
from ppscope.engine.hf import INDEX, check_checkpoint, read_header
from ppscope.errors import CorruptFileError, ErrorCode

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


def _refused(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> CliError:
    """Run it: how it failed, in one line; no run directory was made."""
    out = tmp_path / "run"
    failed = cli_error(
        capsys,
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
        ],
    )
    assert failed.err.count("\n") == 1, failed.err
    assert not out.exists()
    return failed


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
    "damage",
    [
        lambda b: b[:-100],  # truncated
        lambda b: b"",  # empty
        lambda b: b"not a safetensors file at all, but long enough",  # a header length beyond the file
        lambda b: b[:200],  # cut inside the header
        lambda b: b + b"\0" * 8,  # bytes after the data
        lambda b: b[:8] + b"[" + b[9:],  # a header that is not JSON
    ],
    ids=["truncated", "empty", "not-safetensors", "cut-header", "trailing", "header-not-json"],
)
def test_damaged_file_is_exit_1_naming_it(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[bytes], bytes]
) -> None:
    file = ckpt / FILE
    file.write_bytes(damage(file.read_bytes()))
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed.exit_code == CorruptFileError.exit_code == 1 and failed.code == ErrorCode.DAMAGED_FILE, failed
    assert failed.text.startswith(f"{file} "), failed.text  # the file to download again


def test_no_safetensors_files(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ckpt / FILE).unlink()
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_INCOMPLETE) and str(ckpt) in failed.text


def test_a_layer_missing_a_tensor(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.pop(UP))
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_INCOMPLETE) and str(ckpt) in failed.text and UP in failed.text


def test_config_with_more_layers_than_the_file(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _set_config(ckpt, num_hidden_layers=3)
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_INCOMPLETE) and "model.layers.2." in failed.text, failed


def test_tensor_of_the_wrong_shape(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.update({UP: torch.zeros(127, 64)}))
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_MISMATCH), failed
    assert all(name in failed.text for name in (str(ckpt / FILE), UP, "[127, 64]", "[128, 64]")), failed.text


def test_vocab_of_config_and_embedding_differ(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _set_config(ckpt, vocab_size=300)
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_MISMATCH), failed
    assert all(name in failed.text for name in ("model.embed_tokens.weight", "[256, 64]", "[300, 64]")), failed.text


def test_tensor_that_is_not_floating_point(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(ckpt / FILE, lambda t: t.update({UP: torch.zeros(128, 64, dtype=torch.int8)}))
    failed = _refused(ckpt, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.UNSUPPORTED_CHECKPOINT) and UP in failed.text and "I8" in failed.text


def test_index_places_a_tensor_in_a_shard_that_lacks_it(
    sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = sharded / json.loads((sharded / INDEX).read_text())["weight_map"][UP]
    _rewrite(shard, lambda t: t.pop(UP))
    failed = _refused(sharded, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_MISMATCH), failed
    assert str(shard) in failed.text and UP in failed.text and INDEX in failed.text


def test_index_that_lacks_a_tensor(sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((sharded / INDEX).read_text())
    del index["weight_map"][UP]
    (sharded / INDEX).write_text(json.dumps(index))
    failed = _refused(sharded, tmp_path, capsys)
    assert failed[:2] == (2, ErrorCode.CHECKPOINT_INCOMPLETE), failed
    assert str(sharded / INDEX) in failed.text and UP in failed.text


def test_damaged_shard_is_named(sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = sharded / json.loads((sharded / INDEX).read_text())["weight_map"][UP]
    shard.write_bytes(shard.read_bytes()[:-4])
    failed = _refused(sharded, tmp_path, capsys)
    assert failed[:2] == (1, ErrorCode.DAMAGED_FILE) and failed.text.startswith(f"{shard} ")

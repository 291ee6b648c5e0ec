"""The model on its own: a Hugging Face checkpoint gives transformers' tokens and logits, each rank reads only
its own layers, and a packed batch of uneven sequences equals the sequences run one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from error_helpers import raises_code

from ppscope.balance.modelled.shapes import ModelShape
from ppscope.engine.hf import CheckpointSource
from ppscope.engine.model import Batch, RandomSource
from ppscope.engine.stage import build_stage
from ppscope.errors import ErrorCode

CPU = torch.device("cpu")


def _forward(stages: list, tokens: list[int], batch: Batch, shape: ModelShape) -> torch.Tensor:  # type: ignore[type-arg]
    x = stages[0].run_embed(torch.tensor(tokens), shape.hidden, torch.float32)
    for s in stages:
        x = s.run_chunk(0, x, batch)
    return stages[-1].run_head(x, batch, shape.vocab)


def _write_checkpoint(path: Path, **config: object) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    fields: dict[str, object] = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**(fields | config))).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_checkpoint(tmp_path_factory.mktemp("ckpt"))


# Llama 3.1-3.3's rope scaling (3.2 also ties the head to the embedding), with a pretraining context short
# enough that the scaled frequencies matter within the test's few positions; and the older linear scaling.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
SCALED = {
    "llama3": {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True, "rope_theta": 500.0},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
}


def _as_transformers_4(config: Path) -> None:
    """Rewrite a config.json the way transformers 4 writes it (and Hub checkpoints carry it): `rope_theta` at
    the top, `rope_scaling` beside it, where transformers 5 writes both into `rope_parameters`."""
    cfg = json.loads(config.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    config.write_text(json.dumps(cfg))


@torch.no_grad()
@pytest.mark.parametrize("variant", ["plain", "llama3", "llama3, transformers 4 config", "linear"])
def test_checkpoint_matches_transformers(variant: str, checkpoint: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    if variant != "plain":
        checkpoint = _write_checkpoint(tmp_path / "ckpt", **SCALED[variant.split(",")[0]])  # type: ignore[arg-type]
        if "transformers 4" in variant:
            _as_transformers_4(checkpoint / "config.json")
    ref = transformers.LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    shape = ModelShape.from_hf_config(checkpoint, exact=True)
    assert (shape.rope_scaling is None) == (variant == "plain")
    assert shape.rope_theta == (500.0 if variant.startswith("llama3") else 10000.0)
    src = CheckpointSource(checkpoint, shape)
    stages = [build_stage(src, [2, 1], r, 2, 1, CPU, torch.float32) for r in range(2)]
    for s in stages:
        s.allocate_cache(1, 64, torch.float32, shape.kv_heads, shape.head_dim)
    prompt = [5, 17, 99, 3, 42, 8]
    expected_logits = ref(torch.tensor([prompt])).logits[0, -1]
    logits = _forward(stages, prompt, Batch([0], [0], [len(prompt)]), shape)[0]
    assert torch.allclose(logits, expected_logits, atol=1e-4, rtol=0)
    # greedy generation with the KV cache, token by token
    generated, ids = [], prompt
    batch = Batch([0], [0], [len(prompt)])
    for _ in range(6):
        token = int(_forward(stages, ids, batch, shape)[0].argmax())
        generated.append(token)
        ids, batch = [token], Batch([0], [len(prompt) + len(generated) - 1], [1])
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated == out[0, len(prompt) :].tolist()


def test_each_rank_reads_only_its_own_tensors(checkpoint: Path) -> None:
    shape = ModelShape.from_hf_config(checkpoint)
    per_layer = 9  # 7 projections + 2 norms
    counts = []
    for rank in range(2):
        src = CheckpointSource(checkpoint, shape)
        build_stage(src, [2, 1], rank, 2, 1, CPU, torch.float32)
        counts.append(src.tensors_read)
    assert counts == [2 * per_layer + 1, 1 * per_layer + 2]  # + embedding | + final norm and LM head
    config = json.loads((checkpoint / "config.json").read_text())
    assert shape.layers == config["num_hidden_layers"]


@torch.no_grad()
def test_packed_uneven_batch_equals_one_by_one() -> None:
    shape = ModelShape(name="t", layers=2, hidden=32, heads=4, kv_heads=2, intermediate=48, vocab=64, max_seq_len=32)
    stage = build_stage(RandomSource(shape, seed=1), [2], 0, 1, 1, CPU, torch.float64)
    stage.allocate_cache(3, 32, torch.float64, shape.kv_heads, shape.head_dim)
    seqs = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7]]
    alone = []
    for i, s in enumerate(seqs):
        x = stage.run_embed(torch.tensor(s), shape.hidden, torch.float64)
        alone.append(stage.run_head(stage.run_chunk(0, x, Batch([i], [0], [len(s)])), Batch([i], [0], [len(s)]), 64))
    batch = Batch([2, 0, 1], [0, 0, 0], [len(s) for s in seqs])
    x = stage.run_embed(torch.tensor([t for s in seqs for t in s]), shape.hidden, torch.float64)
    packed = stage.run_head(stage.run_chunk(0, x, batch), batch, 64)
    assert torch.allclose(packed, torch.cat(alone), atol=1e-9)
    # one decode step for all three at different positions, against the caches filled above
    step = Batch([2, 0, 1], [len(s) for s in seqs], [1, 1, 1])
    x = stage.run_embed(torch.tensor([3, 1, 4]), shape.hidden, torch.float64)
    decoded = stage.run_head(stage.run_chunk(0, x, step), step, 64)
    one = Batch([2], [len(seqs[0])], [1])
    x = stage.run_embed(torch.tensor([3]), shape.hidden, torch.float64)
    assert torch.allclose(decoded[:1], stage.run_head(stage.run_chunk(0, x, one), one, 64), atol=1e-9)


@torch.no_grad()
@pytest.mark.parametrize("split", [[8], [4, 4], [3, 3, 2], [1, 2, 4, 1]])
def test_any_split_of_seeded_layers_equals_the_whole_model(split: list[int]) -> None:
    shape = ModelShape(name="t", layers=8, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512, max_seq_len=16)
    src = RandomSource(shape, seed=5)
    stages = [build_stage(src, split, r, len(split), 1, CPU, torch.float32) for r in range(len(split))]
    for s in stages:
        s.allocate_cache(1, 16, torch.float32, shape.kv_heads, shape.head_dim)
    whole = build_stage(src, [8], 0, 1, 1, CPU, torch.float32)
    whole.allocate_cache(1, 16, torch.float32, shape.kv_heads, shape.head_dim)
    batch = Batch([0], [0], [6])
    prompt = [11, 400, 80, 3, 77, 124]
    assert torch.equal(_forward(stages, prompt, batch, shape), _forward([whole], prompt, batch, shape))


def test_checkpoint_runs_pipelined_through_the_launcher(checkpoint: Path, tmp_path: Path) -> None:
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.engine.reference import reference_outputs
    from ppscope.trace.store import read_meta

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2, schedule="serve"),
        model=ModelConfig(name=str(checkpoint)),
        workload=WorkloadConfig(requests=3, prompt_len=5, max_new_tokens=4),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    run_dir = run(cfg)
    lines = sorted(
        (json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()), key=lambda r: r["id"]
    )
    assert [r["output_ids"] for r in lines] == reference_outputs(cfg)
    meta = read_meta(run_dir)
    assert meta.model["layers"] == 3 and meta.split == [2, 1] and meta.model["synthetic"] is False


def test_scaled_rope_changes_the_logits(tmp_path: Path) -> None:
    """The scaled checkpoints above test something: read without its scaling, the llama3 one disagrees."""
    import dataclasses

    path = _write_checkpoint(tmp_path / "llama3", **SCALED["llama3"])  # type: ignore[arg-type]
    shape = ModelShape.from_hf_config(path, exact=True)
    prompt, batch = [5, 17, 99, 3, 42, 8, 1, 2, 3, 4, 5, 6], Batch([0], [0], [12])
    logits = []
    for s in (shape, dataclasses.replace(shape, rope_scaling=None)):
        stage = build_stage(CheckpointSource(path, s), [3], 0, 1, 1, CPU, torch.float32)
        stage.allocate_cache(1, 64, torch.float32, s.kv_heads, s.head_dim)
        with torch.no_grad():
            logits.append(_forward([stage], prompt, batch, s)[0])
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)


@pytest.mark.parametrize(
    ("change", "names"),
    [  # the field it names, and its value where that is what the engine cannot compute
        ({"model_type": "qwen2"}, ("model_type", "'qwen2'")),
        ({"attention_bias": True}, ("attention_bias",)),
        ({"hidden_act": "gelu"}, ("hidden_act", "'gelu'")),
        ({"head_dim": 32}, ("head_dim", "32")),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ("rope_scaling", "'yarn'")),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ("rope_scaling",)),
        ({"model_type": "mistral", "sliding_window": 4096}, ("sliding_window",)),
    ],
)
def test_checkpoint_the_engine_would_compute_differently_fails_before_launch(
    checkpoint: Path, tmp_path: Path, change: dict[str, object], names: tuple[str, ...]
) -> None:
    """It fails in one line naming the field, before any process starts; planning still reads the shape."""
    from ppscope.engine.config import ModelConfig
    from ppscope.errors import UnsupportedInputError

    for f in checkpoint.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(json.loads((checkpoint / "config.json").read_text()) | change))
    with raises_code(UnsupportedInputError, ErrorCode.UNSUPPORTED_CHECKPOINT) as err:
        ModelConfig(name=str(tmp_path))
    assert all(name in str(err.value) for name in names) and "\n" not in str(err.value), str(err.value)
    assert ModelShape.from_hf_config(tmp_path).layers == 3


def test_sharded_checkpoint_is_read_through_its_index(checkpoint: Path, tmp_path: Path) -> None:
    """Shards are found from model.safetensors.index.json: a file the index does not list is never opened (here
    one that is not safetensors at all), and a shard it lists but that is missing is named in one line."""
    import shutil

    from ppscope.engine.hf import INDEX
    from ppscope.errors import UnsupportedInputError

    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    shards = sorted(sharded.glob("*.safetensors"))
    assert (sharded / INDEX).is_file() and len(shards) > 2
    (sharded / "consolidated.safetensors").write_bytes(b"not safetensors: another format's copy")
    shape = ModelShape.from_hf_config(sharded, exact=True)
    prompt, batch = [5, 17, 99, 3], Batch([0], [0], [4])
    logits = []
    for path in (checkpoint, sharded):
        src = CheckpointSource(path, shape)
        stages = [build_stage(src, [2, 1], r, 2, 1, CPU, torch.float32) for r in range(2)]
        for s in stages:
            s.allocate_cache(1, 8, torch.float32, shape.kv_heads, shape.head_dim)
        with torch.no_grad():
            logits.append(_forward(stages, prompt, batch, shape))
    assert torch.equal(logits[0], logits[1])
    partial = tmp_path / "partial"
    shutil.copytree(sharded, partial)
    (partial / shards[1].name).unlink()
    with raises_code(UnsupportedInputError, ErrorCode.CHECKPOINT_INCOMPLETE) as err:
        CheckpointSource(partial, shape)
    assert "\n" not in str(err.value) and shards[1].name in str(err.value)  # the missing shard


class _RampingClock:
    """A GPU whose SM clock ramps from 1000 to 1800 MHz over its first 80 ms of work, as an idle GPU's does."""

    def __init__(self) -> None:
        self.busy_ms = 0.0

    def rate(self) -> float:  # cycles per ms
        return 1e6 + 0.8e6 * min(self.busy_ms / 80.0, 1.0)

    def timed_ms(self, cycles: int) -> float:
        took = cycles / self.rate()
        self.busy_ms += took
        return took


def test_the_gpu_sleep_is_calibrated_after_the_clock_settles() -> None:
    from ppscope.engine.model import settled_rate

    gpu = _RampingClock()
    rate = settled_rate(gpu.timed_ms)
    assert rate == pytest.approx(1.8e6, rel=0.01)
    assert gpu.busy_ms >= 100.0  # warmed up at least 100 ms first
    one_sample = _RampingClock()  # what a single sample after a short warm-up would have taken
    one_sample.timed_ms(10_000_000)
    assert 10_000_000 / one_sample.timed_ms(10_000_000) < 1.8e6 * 0.9
    # a clock that never settles: the last sample, after a bounded number of them
    jumpy = iter([10.0] * 11 + [5.0, 10.0] * 100)
    assert settled_rate(lambda cycles: next(jumpy), cycles=10_000, tries=6) == pytest.approx(1_000.0)


@torch.no_grad()
def test_warm_up_runs_every_part_and_leaves_no_trace() -> None:
    """The warm-up before a run goes through embedding, layers and head, and the caches it wrote are zeroed,
    so the run's tokens are those of a stage that never warmed up."""
    shape = ModelShape(name="t", layers=2, hidden=32, heads=4, kv_heads=2, intermediate=48, vocab=64, max_seq_len=32)
    cold, warm = (build_stage(RandomSource(shape, seed=1), [2], 0, 1, 1, CPU, torch.float64) for _ in range(2))
    for s in (cold, warm):
        s.allocate_cache(3, 32, torch.float64, shape.kv_heads, shape.head_dim)
    logits = warm.warm_up(3, 5, shape.hidden, shape.vocab, torch.float64)
    assert logits is not None and tuple(logits.shape) == (3, 64)
    assert all(not c.k.any() and not c.v.any() for c in warm.chunks[0].caches)
    batch = Batch([0, 1], [0, 0], [4, 4])
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    out = [
        s.run_head(s.run_chunk(0, s.run_embed(ids, shape.hidden, torch.float64), batch), batch, 64)
        for s in (cold, warm)
    ]
    assert torch.equal(out[0], out[1])
    middle = build_stage(RandomSource(shape, seed=1), [1, 1], 1, 2, 1, CPU, torch.float64)  # no embedding here
    middle.allocate_cache(2, 32, torch.float64, shape.kv_heads, shape.head_dim)
    assert middle.warm_up(2, 5, shape.hidden, shape.vocab, torch.float64) is not None

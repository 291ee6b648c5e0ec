"""Requests: read from a prompts file or generated from a seed, and written to the run's `requests.jsonl`.

A request is token ids in, token ids out; the engine knows nothing about text or tokenizers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppscope.errors import InvalidConfigError
from ppscope.store import REQUESTS_FILE

__all__ = ["Request", "RequestLog", "generate_requests", "load_prompts", "poisson_arrivals_ns"]


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    max_new_tokens: int
    arrival_ns: int = -1
    """Common clock; set when the request is released to the scheduler."""
    first_token_ns: int = -1
    finish_ns: int = -1
    output_ids: list[int] = field(default_factory=list)
    token_ns: list[int] = field(default_factory=list)
    """When each output token reached rank 0 (common clock)."""

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt_len": len(self.prompt_ids),
            "output_len": len(self.output_ids),
            "arrival_ns": self.arrival_ns,
            "first_token_ns": self.first_token_ns,
            "finish_ns": self.finish_ns,
            "prompt_ids": self.prompt_ids,
            "output_ids": self.output_ids,
            "token_ns": self.token_ns,
        }


def generate_requests(n: int, prompt_len: int, max_new_tokens: int, vocab: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(vocab) for _ in range(prompt_len)], max_new_tokens) for i in range(n)]


def load_prompts(path: str | Path, vocab: int, default_new_tokens: int) -> list[Request]:
    """One JSON object per line: {"prompt_ids": [...], "max_new_tokens": n} (max_new_tokens optional)."""
    out: list[Request] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ids = [int(t) for t in obj["prompt_ids"]]
                new = int(obj.get("max_new_tokens", default_new_tokens))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise InvalidConfigError(
                    f'{path}:{lineno}: expected {{"prompt_ids": [ints], "max_new_tokens": n}}, '
                    f"found {line.strip()[:80]}"
                ) from None
            if not ids or new < 1 or any(not 0 <= t < vocab for t in ids):
                raise InvalidConfigError(
                    f"{path}:{lineno}: prompt_ids must be non-empty token ids in [0, {vocab}) and max_new_tokens >= 1"
                )
            out.append(Request(len(out), ids, new))
    if not out:
        raise InvalidConfigError(f"{path} holds no requests")
    return out


def poisson_arrivals_ns(n: int, rate_per_s: float, seed: int) -> list[int]:
    """Arrival offsets from the start: all zero when rate is 0, else a Poisson process of `rate_per_s`."""
    if rate_per_s <= 0:
        return [0] * n
    rng = random.Random(seed + 7919)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        out.append(int(t * 1e9))
    return out


class RequestLog:
    """Appends each finished request to the run's `requests.jsonl` as it finishes, one JSON object a line,
    so a live reader sees them during the run. Whole lines only: a reader never sees half a record."""

    def __init__(self, run_dir: str | Path) -> None:
        self._f = open(Path(run_dir) / REQUESTS_FILE, "a")  # noqa: SIM115 - closed in close()

    def __call__(self, request: Request) -> None:
        self._f.write(json.dumps(request.record()) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

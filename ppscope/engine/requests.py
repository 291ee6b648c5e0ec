"""Requests: read from a prompts file or generated from a seed, and written to the run's `requests.jsonl`.

A request is token ids in, token ids out; the engine knows nothing about text or tokenizers.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.store import REQUESTS_FILE

__all__ = [
    "Arrivals",
    "GeneratedRequests",
    "PoissonArrivals",
    "Request",
    "RequestLog",
    "generate_requests",
    "load_prompts",
    "poisson_arrivals_ns",
]


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


class GeneratedRequests(Sequence[Request]):
    """`n` requests of `prompt_len` random token ids, each made on first access, in order, from one seeded
    stream: the same requests as a list made at once, but a run of millions starts at once (its memory check
    comes first) and holds only the requests taken so far."""

    def __init__(self, n: int, prompt_len: int, max_new_tokens: int, vocab: int, seed: int) -> None:
        self.n, self.prompt_len, self.max_new_tokens, self.vocab = n, prompt_len, max_new_tokens, vocab
        self._rng = random.Random(seed)
        self._made: list[Request] = []

    def __len__(self) -> int:
        return self.n

    @property
    def made(self) -> int:
        """How many requests were made so far (the first `made`)."""
        return len(self._made)

    @overload
    def __getitem__(self, index: int) -> Request: ...
    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...
    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return [self[i] for i in range(self.n)[index]]
        i = range(self.n)[index]  # IndexError past the end, as a list
        while len(self._made) <= i:
            ids = [self._rng.randrange(self.vocab) for _ in range(self.prompt_len)]
            self._made.append(Request(len(self._made), ids, self.max_new_tokens))
        return self._made[i]


def generate_requests(n: int, prompt_len: int, max_new_tokens: int, vocab: int, seed: int) -> GeneratedRequests:
    return GeneratedRequests(n, prompt_len, max_new_tokens, vocab, seed)


PROMPT_KEYS = ("prompt_ids", "max_new_tokens")


def load_prompts(path: str | Path, vocab: int, default_new_tokens: int, max_len: int | None = None) -> list[Request]:
    """One JSON object per line: {"prompt_ids": [...], "max_new_tokens": n} (max_new_tokens optional), UTF-8
    with or without a BOM. Only JSON integers count: `true`, `1.0`, `"1"` are refused, as is any other key,
    so nothing in the file is read differently from how it was written. `max_len`: the model's positions."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS, f"--prompts {path} cannot be read ({exc.strerror}): give a JSONL file"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        utf16 = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS, f"{path}:{lineno}: not UTF-8 text{utf16}: save the file as UTF-8"
        ) from None
    out: list[Request] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(_parse_prompt(line, f"{path}:{lineno}", len(out), vocab, default_new_tokens, max_len))
    if not out:
        raise InvalidConfigError(ErrorCode.BAD_PROMPTS, f"{path} holds no requests")
    return out


def _parse_prompt(line: str, where: str, rid: int, vocab: int, default_new_tokens: int, max_len: int | None) -> Request:
    try:
        obj = json.loads(line, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS,
            f'{where}: not JSON ({exc.msg} at column {exc.colno}): expected {{"prompt_ids": [ints], '
            f'"max_new_tokens": n}}, found {line.strip()[:80]}',
        ) from None
    except (ValueError, RecursionError) as exc:  # a repeated key, an integer of thousands of digits, deep nesting
        raise InvalidConfigError(ErrorCode.BAD_PROMPTS, f"{where}: cannot read this line: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS, f'{where}: expected a JSON object {{"prompt_ids": [ints], ...}}, found {_show(obj)}'
        )
    unknown = [k for k in obj if k not in PROMPT_KEYS]
    if unknown:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS,
            f'{where}: unknown key "{unknown[0]}"; valid keys: "prompt_ids", "max_new_tokens" (optional)',
        )
    if "prompt_ids" not in obj:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS, f'{where}: no "prompt_ids": give the prompt as a list of integer token ids'
        )
    ids = obj["prompt_ids"]
    if not isinstance(ids, list) or not ids:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS,
            f'{where}: "prompt_ids" must be a non-empty list of integer token ids, found {_show(ids)}',
        )
    for i, t in enumerate(ids):
        if type(t) is not int:  # bool is an int to Python, 1.0 and "1" are not token ids in JSON
            raise InvalidConfigError(
                ErrorCode.BAD_PROMPTS, f'{where}: "prompt_ids"[{i}] is {_show(t)}: token ids are JSON integers'
            )
        if not 0 <= t < vocab:
            raise InvalidConfigError(
                ErrorCode.BAD_PROMPTS,
                f'{where}: "prompt_ids"[{i}] is {t}: token ids of this model are in [0, {vocab}) '
                "(tokenize with the model's tokenizer)",
            )
    new = obj.get("max_new_tokens", default_new_tokens)
    if type(new) is not int or new < 1:
        raise InvalidConfigError(
            ErrorCode.BAD_PROMPTS,
            f'{where}: "max_new_tokens" is {_show(new)}: give an integer >= 1, '
            f"or leave it out for --max-new-tokens ({default_new_tokens})",
        )
    if max_len is not None and len(ids) + new > max_len:
        named = '"max_new_tokens"' if "max_new_tokens" in obj else "--max-new-tokens"
        raise InvalidConfigError(
            ErrorCode.SEQUENCE_TOO_LONG,
            f"{where}: {len(ids)} prompt ids + {new} new tokens ({named}) = {len(ids) + new} positions, but the "
            f"model holds {max_len}: shorten the prompt or lower {named}",
        )
    return Request(rid, ids, new)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of a repeated key; a line that repeats one is refused instead."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f'key "{key}" appears twice')
        obj[key] = value
    return obj


def _show(value: Any) -> str:
    """A value as the file wrote it (JSON: `true`, `"1"`, `Infinity`), shortened to fit in one line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Arrivals:
    """A serve run's requests in order of arrival (FIFO among equal times), each stamped with its arrival on
    the common clock when the scheduler looks at it: requests are taken one by one, never all made up front."""

    def __init__(self, requests: Sequence[Request], offsets_ns: Sequence[int], start_ns: int) -> None:
        n = len(requests)
        if len(offsets_ns) != n:
            raise ValueError(f"{n} requests but {len(offsets_ns)} arrival times")
        # a Poisson process is in order by construction; other offsets are checked (and sorted if need be)
        ordered = isinstance(offsets_ns, PoissonArrivals) or all(a <= b for a, b in itertools.pairwise(offsets_ns))
        self._order = iter(range(n) if ordered else sorted(range(n), key=offsets_ns.__getitem__))
        self._requests, self._offsets, self._start = requests, offsets_ns, start_ns
        self._next: Request | None = None
        self._advance()

    def _advance(self) -> None:
        i = next(self._order, None)
        self._next = None if i is None else self._requests[i]
        if i is not None:
            self._requests[i].arrival_ns = self._start + self._offsets[i]

    def __bool__(self) -> bool:
        return self._next is not None

    def next_ns(self) -> int:
        """When the next request arrives (common clock); call only while one is left."""
        assert self._next is not None
        return self._next.arrival_ns

    def due(self, now_ns: int) -> bool:
        return self._next is not None and self._next.arrival_ns <= now_ns

    def pop(self) -> Request:
        r = self._next
        assert r is not None
        self._advance()
        return r


class PoissonArrivals(Sequence[int]):
    """Arrival offsets from the start (ns), in order: all zero when the rate is 0, else a Poisson process of
    `rate_per_s`. Each is made when first asked for, in order, from one seeded stream (the same times as a list
    made at once), so a run of millions of requests neither waits for nor holds them all."""

    def __init__(self, n: int, rate_per_s: float, seed: int) -> None:
        self._n, self._rate, self._seed = n, rate_per_s, seed
        self._restart()

    def _restart(self) -> None:
        self._rng = random.Random(self._seed + 7919)
        self._index, self._t = -1, 0.0

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        i = index + self._n if index < 0 else index
        if not 0 <= i < self._n:
            raise IndexError(f"arrival {index} of {self._n}")
        if self._rate <= 0:
            return 0
        if i < self._index:  # going back (never in a run): make the stream again from its start
            self._restart()
        while self._index < i:
            self._t += self._rng.expovariate(self._rate)
            self._index += 1
        return int(self._t * 1e9)


def poisson_arrivals_ns(n: int, rate_per_s: float, seed: int) -> PoissonArrivals:
    """Arrival offsets from the start: all zero when rate is 0, else a Poisson process of `rate_per_s`."""
    return PoissonArrivals(n, rate_per_s, seed)


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

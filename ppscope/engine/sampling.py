"""Token sampling: greedy, or temperature + nucleus (top-p), seeded per sequence and position, on the device.

A sampled token is drawn by an exponential race: token = argmax(p_i / E_i) with E_i = -log(U_i), which picks
token i with probability p_i. The uniforms U are a counter-based hash of (seed, sequence id, position, token
id) computed with tensor integer ops, so
- a sequence draws the same tokens whatever micro-batch, cache slot, schedule or stage count it runs in,
  and two sequences never share their random numbers;
- nothing leaves the device: the last stage never waits for its GPU to sample (a host-side generator would
  copy the probabilities to the host every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppscope.engine.model import to_device

__all__ = ["Sampling", "row_keys", "sample", "uniforms"]

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B
"""Multiplier of the 32-bit mixer; below 2**27, so the products of 32-bit values fit an int64."""
_STRIDE = 0x9E3779B1
"""Spreads consecutive token ids over the 32-bit space before mixing (odd: a bijection modulo 2**32)."""


@dataclass(kw_only=True)
class Sampling:
    temperature: float = 0.0
    """0 = greedy (argmax)."""
    top_p: float = 1.0
    seed: int = 0


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2**32): every bit of the input moves
    about half of the output's."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def row_keys(seed: int, seqs: list[int], positions: list[int]) -> list[int]:
    """One 32-bit key per row from (seed, sequence id, position of the token being drawn)."""
    rows = torch.tensor([[seed & _M32, s & _M32, p & _M32] for s, p in zip(seqs, positions, strict=True)])
    key = _mix(rows[:, 0])
    key = _mix(key ^ rows[:, 1])
    return _mix(key ^ rows[:, 2]).tolist()


def uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms in (0, 1), a pure function of each row's key and the token id."""
    ids = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    bits = _mix((keys[:, None] ^ ((ids[None, :] * _STRIDE) & _M32)) & _M32)
    return ((bits >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def sample(logits: torch.Tensor, cfg: Sampling, keys: list[int] | None = None) -> torch.Tensor:
    """Token ids (B,) from logits (B, vocab): argmax when greedy, else a draw from the temperature-scaled
    distribution cut to its top-p nucleus, row b with the random numbers of `keys[b]` (see `row_keys`)."""
    if cfg.temperature <= 0:
        return logits.argmax(-1)
    if keys is None or len(keys) != logits.shape[0]:
        raise ValueError("sampling with a temperature needs one key per row (see row_keys)")
    probs = torch.softmax(logits.float() / cfg.temperature, -1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # the most likely token is always kept
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    u = uniforms(to_device(torch.tensor(keys, dtype=torch.int64), logits.device), logits.shape[-1])
    return (probs / -torch.log(u)).argmax(-1)

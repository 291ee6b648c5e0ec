"""Sampling: greedy, temperature and top-p draws keyed by (seed, sequence, position), on the logits' device."""

from __future__ import annotations

import pytest
import torch

from ppscope.engine.sampling import Sampling, row_keys, sample, uniforms


def test_greedy_is_the_argmax_and_needs_no_keys() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    assert sample(logits, Sampling()).tolist() == [1, 0]


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 20_000
    logits = probs.log().expand(n, -1)
    ids = sample(logits, Sampling(temperature=1.0), row_keys(7, list(range(n)), [3] * n))
    freq = torch.bincount(ids, minlength=4).double() / n
    # 4 standard errors of a binomial proportion at n = 20,000 is at most 0.0142
    assert torch.allclose(freq, probs.double(), atol=0.0142), freq


def test_temperature_flattens_and_sharpens() -> None:
    logits = torch.tensor([2.0, 0.0]).expand(4000, -1)
    keys = row_keys(1, list(range(4000)), [0] * 4000)
    hot = (sample(logits, Sampling(temperature=4.0), keys) == 1).double().mean()
    cold = (sample(logits, Sampling(temperature=0.25), keys) == 1).double().mean()
    # P(token 1) = 1 / (1 + e^(2/T)): 0.378 at T=4, 0.0003 at T=0.25
    assert abs(hot - 0.378) < 0.03 and cold < 0.005


def test_top_p_draws_only_from_the_nucleus() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 4000
    ids = sample(probs.log().expand(n, -1), Sampling(temperature=1.0, top_p=0.6), row_keys(0, list(range(n)), [0] * n))
    counts = torch.bincount(ids, minlength=4)
    assert counts[2] == 0 and counts[3] == 0  # 0.4 + 0.3 reach 0.6: the nucleus is the first two
    assert abs(counts[0] / n - 0.4 / 0.7) < 0.03
    keys = row_keys(0, list(range(50)), [0] * 50)
    tiny = sample(probs.log().expand(50, -1), Sampling(temperature=1.0, top_p=1e-6), keys)
    assert (tiny == 0).all()  # the most likely token is always kept


def test_a_draw_depends_on_seed_sequence_and_position_only() -> None:
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(0))
    cfg = Sampling(temperature=1.0)
    keys = row_keys(5, [10, 11, 12], [4, 4, 9])
    alone = [sample(logits[b : b + 1], cfg, [k]).item() for b, k in enumerate(keys)]
    assert sample(logits, cfg, keys).tolist() == alone  # whatever rows share its batch
    assert len(set(row_keys(5, [10, 11, 10, 10], [4, 4, 5, 4]))) == 3  # another sequence or position: other numbers
    assert row_keys(6, [10], [4]) != row_keys(5, [10], [4])
    u = uniforms(torch.tensor(keys), 500)
    assert u.shape == (3, 500) and u.min() > 0 and u.max() < 1
    assert u.mean().item() == pytest.approx(0.5, abs=0.03)


def test_temperature_without_keys_is_refused() -> None:
    with pytest.raises(ValueError):  # its one refusal
        sample(torch.zeros(2, 3), Sampling(temperature=1.0), [1])

"""SamplingParams validation and the target distribution."""

from __future__ import annotations

import pytest
import torch

from local_verifier.sampling import (
    SamplingParams,
    greedy_token,
    inverse_cdf,
    make_generator,
    sample,
    target_probs,
)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_k": -1},
        {"top_k": 1.5},
        {"top_p": 0.0},
        {"top_p": 1.2},
        {"seed": "7"},
    ],
)
def test_invalid_values_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_greedy_is_one_hot_at_argmax() -> None:
    probs = target_probs(torch.tensor([0.1, 3.0, 2.0]), SamplingParams())
    assert probs.tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 3.0, 3.0, 2.0],  # ties: the first
        [1.0, float("nan"), 3.0, float("nan")],  # NaN counts as the largest, the first one
        [-0.0, 0.0, -1.0],
        [float("-inf"), float("-inf")],
    ],
)
def test_greedy_token_is_torch_argmax(values: list[float]) -> None:
    logits = torch.tensor(values)
    assert greedy_token(logits) == int(logits.argmax())
    row = torch.randn(49152, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():  # a step's logits are inference tensors
        assert greedy_token(row.clone()) == int(row.argmax())


def test_temperature_top_k_top_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    plain = target_probs(logits, SamplingParams(temperature=1.0))
    torch.testing.assert_close(plain, torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top2 = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(top2, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top_p 0.8: the smallest set reaching 0.8 is {0.5, 0.3}
    nucleus = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(nucleus, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    nucleus = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert (nucleus > 0).sum() == 3
    hot = target_probs(logits, SamplingParams(temperature=0.5))
    assert hot[0] > plain[0] and abs(float(hot.sum()) - 1) < 1e-6


def test_sampling_follows_probs_and_seed_repeats() -> None:
    probs = torch.tensor([0.2, 0.0, 0.8])
    gen = make_generator(123)
    draws = [sample(probs, gen) for _ in range(2000)]
    assert 1 not in draws
    assert 0.75 < draws.count(2) / len(draws) < 0.85
    again = make_generator(123)
    assert [sample(probs, again) for _ in range(2000)] == draws


@pytest.mark.parametrize(
    ("u", "expected"),
    [(0.0, 1), (0.25 - 1e-12, 1), (0.25, 3), (0.999999, 3), (1 - 2**-53, 3)],
)
def test_inverse_cdf_skips_zero_tokens(u: float, expected: int) -> None:
    """Token i answers a uniform in [cdf[i-1], cdf[i]); zero-probability tokens (0, 2, 4)
    never, the last possible token also when u * total rounds up to the total."""
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    assert inverse_cdf(probs, torch.tensor(u, dtype=torch.float64)) == expected


def test_sample_draws_one_uniform_per_token() -> None:
    """Each draw consumes exactly one float64 uniform of the request's generator."""
    probs = torch.softmax(torch.randn(49152, generator=make_generator(5)), 0)
    a, b = make_generator(9), make_generator(9)
    for _ in range(20):
        sample(probs, a)
        torch.rand((), dtype=torch.float64, generator=b)
    assert torch.equal(a.get_state(), b.get_state())

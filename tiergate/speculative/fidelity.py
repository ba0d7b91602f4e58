"""Is a speculative engine's *sampling* the same weights' sampling?

Greedy answers compare token by token (:func:`tiergate.speculative.measure.losslessness`);
sampled ones can only compare as distributions. Speculative sampling (rejection sampling
of drafted tokens) is exact: each emitted token has the distribution the weights give it
without speculation. So, sampled many times with and without speculation, the tokens at
each position must have one distribution.

:func:`sampling_fidelity` samples a short continuation of a repetitive prompt (where ngram
drafting finds its n-grams and actually drafts) ``samples`` times from each engine, each
request with its own seed, and compares positions 2..``positions``: the first token comes
from the prefill's ordinary sampler, so only the later ones went through speculation's
rejection sampler. Each position is a two-sample test of homogeneity: the chi-square
statistic of the position's token counts (the rare tokens counted as one), its p-value
from label permutations (exact enough for small counts, where the chi-square law is not). A fixed
permutation seed makes the verdict a function of the samples. The speculative engine's
``vllm:spec_decode_*`` counters say whether it drafted at all while sampled.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from tiergate.speculative.measure import Acceptance, acceptance_between, spec_counters

# Words of one repeating cycle: the next word is likely but not certain at temperature 1,
# and every suffix of it occurs earlier in the prompt, which is what ngram drafting looks up.
REPETITIVE_PROMPT = (
    "Colours, in the order of the list: "
    + "red, green, blue, yellow, purple, orange, " * 6
    + "red,"
)


@dataclass(frozen=True)
class PositionTest:
    position: int  # 1-based: 1 is the prefill's token
    chi_square: float
    p_value: float
    distinct_tokens: int
    top_share: tuple[float, float]  # the pooled most frequent token's share, (base, spec)


@dataclass(frozen=True)
class Fidelity:
    samples: int
    positions: list[PositionTest]
    acceptance: Acceptance
    alpha: float

    @property
    def p_min(self) -> float:
        return min(test.p_value for test in self.positions)

    @property
    def same_distribution(self) -> bool:
        """No position differs at ``alpha`` (Bonferroni over the positions tested)."""
        return self.p_min >= self.alpha / len(self.positions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "alpha": self.alpha,
            "same_distribution": self.same_distribution,
            "positions": [test.__dict__ for test in self.positions],
            "acceptance": self.acceptance.as_dict(),
        }


def _sample(client: httpx.Client, model: str, seed: int, max_tokens: int) -> list[int]:
    resp = client.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": REPETITIVE_PROMPT,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": seed,
            "return_token_ids": True,
        },
    )
    resp.raise_for_status()
    return list(resp.json()["choices"][0]["token_ids"])


def _samples(url: str, model: str, count: int, max_tokens: int, workers: int) -> list[list[int]]:
    with (
        httpx.Client(base_url=url.rstrip("/"), timeout=300) as client,
        ThreadPoolExecutor(workers) as pool,
    ):
        return list(pool.map(lambda seed: _sample(client, model, seed, max_tokens), range(count)))


def chi_square(first: np.ndarray, total: np.ndarray, n: int) -> np.ndarray:
    """The chi-square statistic of homogeneity of two samples, for each row of ``first``
    (the first sample's category counts, ``n`` draws) against the rest of ``total`` (both
    samples' counts together)."""
    size = int(total.sum())
    second = total - first
    expected_first = n * total / size
    expected_second = (size - n) * total / size
    return np.asarray(
        ((first - expected_first) ** 2 / expected_first).sum(axis=-1)
        + ((second - expected_second) ** 2 / expected_second).sum(axis=-1)
    )


def permutation_test(
    base: list[int],
    spec: list[int],
    permutations: int = 20_000,
    seed: int = 0,
    min_count: int = 10,
) -> tuple[float, float]:
    """(statistic, p-value) of "``base`` and ``spec`` are draws of one distribution".

    Tokens drawn fewer than ``min_count`` times in the two samples together share one
    category: a hundred tokens seen once each would otherwise dominate the statistic (each
    permutation moves them too) and hide a shift of a tenth of the mass from the likely
    tokens to the unlikely ones, which is what broken sampling does. The smallest p-value
    ``permutations`` can show is ``1 / (permutations + 1)``."""
    pooled_counts = Counter(base + spec)
    common = sorted(t for t, c in pooled_counts.items() if c >= min_count)
    categories = {token: index for index, token in enumerate(common)}
    rare = len(categories)
    pooled = np.array([categories.get(t, rare) for t in base + spec])
    k, n = rare + 1, len(base)
    total = np.bincount(pooled, minlength=k)
    keep = total > 0
    total = total[keep]
    observed = float(chi_square(np.bincount(pooled[:n], minlength=k)[keep], total, n))
    rng = np.random.default_rng(seed)
    as_extreme = 0
    for done in range(0, permutations, 1000):
        orders = rng.permuted(np.tile(pooled, (min(1000, permutations - done), 1)), axis=1)
        first = (orders[:, :n, None] == np.arange(k)).sum(axis=1)[:, keep]
        as_extreme += int((chi_square(first, total, n) >= observed - 1e-9).sum())
    return observed, (as_extreme + 1) / (permutations + 1)


def sampling_fidelity(
    spec_url: str,
    base_url: str,
    model: str,
    samples: int = 400,
    positions: int = 4,
    alpha: float = 1e-3,
    workers: int = 8,
) -> Fidelity:
    """Sample both engines and test positions 2..``positions`` (see the module's text)."""
    with httpx.Client(base_url=spec_url.rstrip("/"), timeout=60) as client:
        before = spec_counters(client.get("/metrics").text)
        spec = _samples(spec_url, model, samples, positions, workers)
        acceptance = acceptance_between(before, spec_counters(client.get("/metrics").text))
    base = _samples(base_url, model, samples, positions, workers)
    tests = []
    for position in range(2, positions + 1):
        at_base = [tokens[position - 1] for tokens in base]
        at_spec = [tokens[position - 1] for tokens in spec]
        statistic, p_value = permutation_test(at_base, at_spec)
        top, _ = Counter(at_base + at_spec).most_common(1)[0]
        tests.append(
            PositionTest(
                position,
                round(statistic, 3),
                p_value,
                len(set(at_base) | set(at_spec)),
                (at_base.count(top) / samples, at_spec.count(top) / samples),
            )
        )
    return Fidelity(samples, tests, acceptance, alpha)

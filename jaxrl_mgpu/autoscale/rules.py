"""The arithmetic of the auto-scale search (autoscale/__init__.py), pure functions of the sizes
compiled or probed: the memory line, the next size to climb to, the sizes worth probing between,
the choice."""

from __future__ import annotations

from typing import Callable

import numpy as np

MIN_PER_DEVICE = 2 ** 8  # the smallest size the search compiles, unless the run's updates need fewer
WITHIN = 0.05           # throughput: the smallest size within 5% of the best


def fit_line(sizes: list[int], values: list[float]) -> Callable[[int], float]:
    """Least squares bytes = a + b * size (exact through two points; through the origin from one,
    which over-estimates, as the fixed part is counted once per size)."""
    b, a = np.polyfit(np.asarray(sizes, float), np.asarray(values, float), 1) if len(sizes) > 1 \
        else (values[0] / sizes[0], 0.0)
    return lambda n: float(a + b * n)


def smallest_within(rates: dict[int, float]) -> int:
    """The smallest size whose steps/s are within WITHIN of the fastest's."""
    return min(n for n in rates if rates[n] >= (1 - WITHIN) * max(rates.values()))


def per_env_model(rates: dict[int, float]) -> tuple[float, float] | None:
    """An update's time per env step at size n as `fixed + per_env * n` (launches, the host and
    the work that does not grow with the batch, plus the work per environment), so steps/s
    approach 1 / per_env from below. per_env is the smallest slope between sizes probed one after
    another, the most optimistic (steps/s can grow faster than one line between some sizes);
    None where time did not grow with the size (all fixed: far from saturation)."""
    sizes = sorted(rates)
    slopes = [(b / rates[b] - a / rates[a]) / (b - a) for a, b in zip(sizes, sizes[1:])]
    slopes = [x for x in slopes if x > 0]
    if not slopes:
        return None
    top = sizes[-1]
    return top / rates[top] - min(slopes) * top, min(slopes)


def doubling_gain(rates: dict[int, float]) -> float:
    """The largest size's gain in steps/s over the next smaller one probed, per doubling of the
    size (a 4x step that gained 4% gained 2% per doubling)."""
    top = max(rates)
    below = max(n for n in rates if n < top)
    return (rates[top] / rates[below]) ** (1 / np.log2(top / below)) - 1


def next_size(rates: dict[int, float]) -> int:
    """The size to probe after the largest so far: the power of 2 where `per_env_model` puts
    steps/s at 95% of their limit (fixed / per_env x 19), at least 4x and at most 16x the
    largest (16x where time did not grow with the size). Where the model says the largest is
    already at 95%, 2x: the smallest step that can show it wrong (the model's limit is an
    estimate, and can be low), and the cheapest compile (a conv net's compile time grows with
    the size)."""
    top, model = max(rates), per_env_model(rates)
    target = 16 * top if model is None else 19 * max(model[0], 0.0) / model[1]
    least = 2 * top if target <= top else 4 * top
    return int(np.clip(2 ** np.ceil(np.log2(max(target, 1.0))), least, 16 * top))


def between(rates: dict[int, float], chosen: int, floor: int = MIN_PER_DEVICE) -> int | None:
    """The smallest power of 2 between the choice and the largest size probed below it whose
    steps/s, interpolated (time per update linear in the size between the two), would be within
    WITHIN of the fastest: that size is probed next. Where nothing below the choice was probed,
    half the choice (not under `floor`)."""
    below = [n for n in rates if n < chosen]
    if not below:
        return chosen // 2 if chosen // 2 >= floor else None
    low = max(below)
    t_low, t_chosen = low / rates[low], chosen / rates[chosen]
    for k in range(int(np.log2(low)) + 1, int(np.log2(chosen))):
        n = 2 ** k
        rate = n / (t_low + (t_chosen - t_low) * (n - low) / (chosen - low))
        if rate >= (1 - WITHIN) * max(rates.values()):
            return n
    return None

"""The planner of `packing.py` written again in pure Python (no numpy, no numba).

It exists to keep the compiled planner honest: the tests assert both give identical plans, and
`benchmarks/packing.py` measures the speed-up of the compiled one. Written independently (sorted(),
heapq, plain lists) so that a shared mistake is unlikely; the training code never calls it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

MAX_GUESSES = 4  # as packing._MAX_GUESSES


def _lpt_fill(sorted_lengths: Sequence[int], num_bins: int) -> tuple[int, list[int], list[int]]:
    """LPT with a (load, bin) min-heap; return (max load, bin of each sample, load of each bin)."""
    heap = [(0, b) for b in range(num_bins)]  # already a valid heap
    loads = [0] * num_bins
    bin_of = []
    for length in sorted_lengths:
        load, b = heap[0]
        loads[b] = load + length
        bin_of.append(b)
        heapq.heapreplace(heap, (load + length, b))
    return max(loads), bin_of, loads


def _smallest_fitting_m(sorted_lengths: list[int], num_ranks: int, cap: int, first_m: int) -> int:
    """The search over m of `packing._assign_bins`: guided guesses, then bisection."""
    n, total = len(sorted_lengths), sum(sorted_lengths)
    lo, hi = first_m - 1, -(-n // num_ranks)
    m, guesses = first_m, 0
    while True:
        max_load = _lpt_fill(sorted_lengths, m * num_ranks)[0]
        if max_load <= cap:
            hi = m
        else:
            lo = m
        if hi - lo <= 1:
            return hi
        den = total - m * num_ranks * (max_load - cap)
        if guesses < MAX_GUESSES and den > 0:
            m, guesses = -(-(total * m) // den), guesses + 1
        else:
            m = (lo + hi) // 2
        m = min(max(m, lo + 1), hi - 1)


def plan_micro_batches_reference(
    lengths: Sequence[int], num_ranks: int, max_tokens_per_rank: int
) -> list[list[list[int]]]:
    """Same contract and same output as `packing.plan_micro_batches` (valid input only)."""
    lengths = [int(x) for x in lengths]
    n = len(lengths)
    if n == 0:
        return []
    cap = max_tokens_per_rank
    order = sorted(range(n), key=lambda i: -lengths[i])  # stable: ties keep their position
    sorted_lengths = [lengths[i] for i in order]
    over_half = sum(1 for x in lengths if 2 * x > cap)
    first_m = max(1, -(-sum(lengths) // (num_ranks * cap)), -(-over_half // num_ranks))
    num_micro = _smallest_fitting_m(sorted_lengths, num_ranks, cap, first_m)
    _, bin_of, loads = _lpt_fill(sorted_lengths, num_micro * num_ranks)

    bins_by_load = sorted(range(num_micro * num_ranks), key=lambda b: -loads[b])
    slot_of_bin = [0] * len(bins_by_load)
    for slot, b in enumerate(bins_by_load):
        slot_of_bin[b] = slot
    slots: list[list[int]] = [[] for _ in bins_by_load]
    for k, position in enumerate(order):
        slots[slot_of_bin[bin_of[k]]].append(position)
    for members in slots:
        members.sort()
    return [slots[i * num_ranks : (i + 1) * num_ranks] for i in range(num_micro)]

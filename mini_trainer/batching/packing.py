"""Token-balanced packing of one global batch into micro-batches across ranks.

Every rank waits for the slowest one at every micro-step, so what costs time is, per micro-batch,
the most-loaded rank's tokens. The planner therefore splits the batch into `m * num_ranks` bins
(no bin above the token cap) with loads as even as possible, using the fewest `m` it can:

1. Sort samples by length, longest first (numpy's stable argsort: ties keep their position, so
   the plan is deterministic).
2. Longest-processing-time-first (LPT): give each sample to the least-loaded bin (ties: the lowest
   bin index). The least-loaded bin is also the one with the most room, so if the sample does not
   fit there it fits nowhere and this `m` fails.
3. `m` starts at a lower bound (the tokens need `ceil(total / (ranks * cap))` micro-batches, and
   samples longer than half the cap need a bin each); for a 128-sample batch that first try
   almost always fits. Otherwise the search keeps a bracket (largest `m` known to fail, smallest
   known to fit; `ceil(n / ranks)`, one sample per bin, always fits) and picks the next `m` from
   the last try: LPT ends with max load = mean load + a spread that changes little with `m`, so it
   asks for the `m` whose mean load leaves room for that spread. After a few such guesses it
   bisects. The answer is an `m` that fits while `m - 1` does not; for 10^6 samples (benchmark)
   that takes four LPT runs where a linear search up from the bound would take fourteen.
4. Bins are sorted by load, heaviest first, and dealt out `num_ranks` at a time: micro-batch 0
   gets the `num_ranks` heaviest bins, and so on. Grouping bins of similar load minimises the sum
   over micro-batches of the heaviest bin, and running the heaviest micro-batch first makes an
   out-of-memory error show up on the first micro-step rather than later.

The LPT heap loop and the search over `m` are compiled with numba (`cache=True`); the sort and the
list building use numpy. `plan_micro_batches_reference` in `packing_reference.py` is the same
algorithm in pure Python, used to cross-check this one and to measure the speed-up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def _default_numba_cache_dir() -> str:
    """A per-user cache folder, so numba's compiled kernels never land in the source tree."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for candidate in (
        base / "mini_trainer" / "numba",
        Path(tempfile.gettempdir()) / f"mini_trainer-numba-{os.getuid()}",
    ):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return str(candidate)
    return str(Path(tempfile.mkdtemp(prefix="mini_trainer-numba-")))


if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = _default_numba_cache_dir()

import numba  # noqa: E402  (NUMBA_CACHE_DIR must be set before numba is imported)

_MAX_GUESSES = 4
"""Guided tries of the search over m before it falls back to bisection (see `_assign_bins`)."""


@numba.njit(cache=True)
def _lpt_fill(sorted_lengths, num_bins, bin_of, loads):
    """LPT over `num_bins` bins; fill `bin_of` (bin of each sample) and `loads`; return max load.

    `sorted_lengths` is sorted descending. No capacity check inside the loop: the placement is
    the same as a capacity-checked LPT's up to the first sample that would overflow, and that
    sample overflows here too, so "fits" is simply "max load <= cap", and the max load of a
    failed try tells the search how far off it was.

    A binary min-heap of keys `load << shift | bin` picks the least-loaded bin, ties going to the
    lowest bin index; keys are unique, so the choice never depends on the heap's layout. One
    int64 per key halves the memory traffic of (load, bin) pairs. The caller guarantees that
    `total << shift` fits in 63 bits.
    """
    shift = np.int64(1)
    while (np.int64(1) << shift) < num_bins:
        shift += 1
    mask = (np.int64(1) << shift) - 1
    heap = np.arange(num_bins).astype(np.int64)  # all loads 0: a valid heap
    loads[:num_bins] = 0
    max_load = 0
    for k in range(sorted_lengths.shape[0]):
        b = heap[0] & mask
        load = (heap[0] >> shift) + sorted_lengths[k]
        bin_of[k] = b
        loads[b] = load
        if load > max_load:
            max_load = load
        key = (load << shift) | b
        # The root's key grew. Bottom-up sift (as heapq does): walk the hole down to a leaf along
        # the smaller children, then move the key up to its place; the key usually belongs deep.
        i = 0
        child = 1
        while child < num_bins:
            if child + 1 < num_bins and heap[child + 1] < heap[child]:
                child += 1
            heap[i] = heap[child]
            i = child
            child = 2 * i + 1
        while i > 0:
            parent = (i - 1) >> 1
            if heap[parent] > key:
                heap[i] = heap[parent]
                i = parent
            else:
                break
        heap[i] = key
    return max_load


@numba.njit(cache=True)
def _assign_bins(sorted_lengths, num_ranks, cap, first_m):
    """Smallest number of micro-batches `m` >= `first_m` for which LPT fits (see module doc).

    Return (m, bin_of, loads) with `bin_of[k]` the bin of the k-th longest sample and `loads` the
    tokens per bin (length `m * num_ranks`).
    """
    n = sorted_lengths.shape[0]
    total = sorted_lengths.sum()
    lo = first_m - 1  # known not to fit (below the lower bound)
    hi = (n + num_ranks - 1) // num_ranks  # known to fit: at most one sample per bin
    bin_of = np.empty(n, dtype=np.int64)
    loads = np.zeros(hi * num_ranks, dtype=np.int64)
    best_bin_of = np.empty(0, dtype=np.int64)  # the plan of the smallest m tried that fits
    best_loads = np.empty(0, dtype=np.int64)
    m = first_m
    guesses = 0
    while True:
        max_load = _lpt_fill(sorted_lengths, m * num_ranks, bin_of, loads)
        if max_load <= cap:
            hi = m
            best_bin_of = bin_of.copy()
            best_loads = loads[: m * num_ranks].copy()
        else:
            lo = m
        if hi - lo <= 1:
            break
        # LPT ends with max_load = mean + spread, the spread changing little with m: ask for the m
        # whose mean load leaves room for this try's spread, total / (R * (cap - spread)).
        den = total - m * num_ranks * (max_load - cap)
        if guesses < _MAX_GUESSES and den > 0:
            m = (total * m + den - 1) // den
            guesses += 1
        else:
            m = (lo + hi) // 2
        m = min(max(m, lo + 1), hi - 1)
    if best_loads.shape[0] != hi * num_ranks:  # hi was never tried (one sample per bin)
        _lpt_fill(sorted_lengths, hi * num_ranks, bin_of, loads)
        return hi, bin_of, loads[: hi * num_ranks].copy()
    return hi, best_bin_of, best_loads


@numba.njit(cache=True)
def _group_by_slot(slot_of_position, num_slots):
    """Counting sort: positions grouped by slot, ascending within a slot, and slot bounds."""
    bounds = np.zeros(num_slots + 1, dtype=np.int64)
    for s in slot_of_position:
        bounds[s + 1] += 1
    for s in range(num_slots):
        bounds[s + 1] += bounds[s]
    fill = bounds[:-1].copy()
    grouped = np.empty(slot_of_position.shape[0], dtype=np.int64)
    for position in range(slot_of_position.shape[0]):
        s = slot_of_position[position]
        grouped[fill[s]] = position
        fill[s] += 1
    return grouped, bounds


def check_lengths(lengths, num_ranks: int, max_tokens_per_rank: int) -> np.ndarray:
    """Validate the planner's arguments; return `lengths` as a 1-D int64 array.

    A sample longer than the cap could never be placed, so it is an error that names the sample
    (its position in `lengths`) rather than a silently dropped sample.
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)):
        raise ValueError(f"num_ranks must be an integer, got {num_ranks!r}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}")
    if isinstance(max_tokens_per_rank, bool) or not isinstance(
        max_tokens_per_rank, (int, np.integer)
    ):
        raise ValueError(f"max_tokens_per_rank must be an integer, got {max_tokens_per_rank!r}")
    if max_tokens_per_rank < 1:
        raise ValueError(f"max_tokens_per_rank must be at least 1, got {max_tokens_per_rank}")
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"lengths must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.size:
        too_short = np.flatnonzero(array < 1)
        if too_short.size:
            i = int(too_short[0])
            raise ValueError(f"sample at position {i} has length {int(array[i])}; must be >= 1")
        too_long = np.flatnonzero(array > max_tokens_per_rank)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"sample at position {i} has {int(array[i])} tokens, more than "
                f"max_tokens_per_rank={int(max_tokens_per_rank)}"
            )
    return array


def lower_bound_micro_batches(lengths: np.ndarray, num_ranks: int, max_tokens_per_rank: int) -> int:
    """Micro-batches that any plan needs: for the tokens, and for samples over half the cap."""
    if lengths.size == 0:
        return 0
    by_tokens = -(-int(lengths.sum()) // (num_ranks * max_tokens_per_rank))
    over_half = int(np.count_nonzero(2 * lengths > max_tokens_per_rank))
    return max(1, by_tokens, -(-over_half // num_ranks))


def plan_micro_batches(
    lengths: np.ndarray, num_ranks: int, max_tokens_per_rank: int
) -> list[list[list[int]]]:
    """Split samples of the given token `lengths` into micro-batches across `num_ranks` ranks.

    Return `plan` with `plan[m][r]` the positions (into `lengths`) that rank `r` packs into one
    row in micro-batch `m`, in ascending order. Every position appears exactly once; every
    micro-batch has exactly `num_ranks` lists, none summing to more than `max_tokens_per_rank`
    tokens; a list may be empty (that rank runs a zero-loss dummy). Same input, same plan.
    Empty `lengths` gives `[]`. A sample longer than the cap raises `ValueError`.
    """
    lengths = check_lengths(lengths, num_ranks, max_tokens_per_rank)
    if lengths.size == 0:
        return []
    max_bins = -(-lengths.size // num_ranks) * num_ranks
    if int(lengths.sum()).bit_length() + max(1, (max_bins - 1).bit_length()) > 62:
        raise ValueError("too many tokens to plan at once (the heap keys would overflow int64)")
    order = np.argsort(-lengths, kind="stable")
    num_micro, bin_of_sorted, loads = _assign_bins(
        lengths[order],
        np.int64(num_ranks),
        np.int64(max_tokens_per_rank),
        np.int64(lower_bound_micro_batches(lengths, num_ranks, max_tokens_per_rank)),
    )
    return _bins_to_plan(order, bin_of_sorted, loads, num_micro, num_ranks)


def _bins_to_plan(
    order: np.ndarray, bin_of_sorted: np.ndarray, loads: np.ndarray, num_micro: int, num_ranks: int
) -> list[list[list[int]]]:
    """Deal bins (heaviest first) to (micro-batch, rank) slots; list positions per slot."""
    num_slots = num_micro * num_ranks
    slot_of_bin = np.empty(num_slots, dtype=np.int64)
    slot_of_bin[np.argsort(-loads, kind="stable")] = np.arange(num_slots)
    slot_of_position = np.empty(order.size, dtype=np.int64)
    slot_of_position[order] = slot_of_bin[bin_of_sorted]
    grouped, bounds = _group_by_slot(slot_of_position, np.int64(num_slots))
    positions = grouped.tolist()
    bounds = bounds.tolist()
    slots = [positions[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    return [slots[s : s + num_ranks] for s in range(0, num_slots, num_ranks)]

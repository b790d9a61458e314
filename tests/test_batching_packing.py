"""plan_micro_batches: the invariants on hand-picked and random inputs, and its pure-Python twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_trainer.batching.packing import lower_bound_micro_batches, plan_micro_batches
from mini_trainer.batching.packing_reference import plan_micro_batches_reference


def check_plan(plan, lengths, num_ranks, cap):
    """Assert every invariant of the planner's contract; return the micro-batch count."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        assert plan == []
        return 0
    assert len(plan) >= lower_bound_micro_batches(lengths, num_ranks, cap)
    # At most one sample per bin is always possible, so more micro-batches is never needed.
    assert len(plan) <= -(-lengths.size // num_ranks)
    seen = []
    for micro_batch in plan:
        assert len(micro_batch) == num_ranks  # same number of micro-batches on every rank
        assert any(micro_batch), "a micro-batch where every rank runs a dummy is wasted"
        for positions in micro_batch:
            assert all(type(p) is int for p in positions)
            assert positions == sorted(positions)
            assert int(lengths[positions].sum()) <= cap
            seen.extend(positions)
    assert sorted(seen) == list(range(lengths.size))  # each sample exactly once
    return len(plan)


def test_hand_example():
    # total 24 tokens, 2 ranks, cap 8: at least 2 micro-batches; LPT fits in exactly 2.
    lengths = np.array([5, 3, 8, 2, 2, 4])
    plan = plan_micro_batches(lengths, num_ranks=2, max_tokens_per_rank=8)
    # Longest first: 8(p2) 5(p0) 4(p5) 3(p1) 2(p3) 2(p4) over 4 bins. LPT: b0={p2}, b1={p0},
    # b2={p5}, b3={p1}; p3 -> b3 (load 5); p4 -> b2 (least loaded, 4 -> 6). Loads 8, 5, 6, 5;
    # heaviest first (ties by bin): b0, b2 | b1, b3.
    assert plan == [[[2], [4, 5]], [[0], [1, 3]]]
    check_plan(plan, lengths, 2, 8)


def test_empty_and_single():
    assert plan_micro_batches(np.array([], dtype=np.int64), 4, 10) == []
    assert plan_micro_batches(np.array([7]), 3, 7) == [[[0], [], []]]


def test_fewer_samples_than_ranks_gives_dummies_not_extra_micro_batches():
    plan = plan_micro_batches(np.array([1, 1, 1]), 8, 100)
    assert len(plan) == 1
    assert sorted(len(r) for r in plan[0]) == [0] * 5 + [1] * 3


def test_balances_the_ranks():
    # 8 equal samples on 4 ranks with room for all: two per rank, one micro-batch.
    plan = plan_micro_batches(np.full(8, 10), 4, 100)
    assert [len(r) for r in plan[0]] == [2, 2, 2, 2]
    # LPT on a classic instance: loads come out even.
    lengths = np.array([7, 6, 5, 4, 3, 3, 2, 2])
    plan = plan_micro_batches(lengths, 2, 100)
    assert sorted(int(lengths[r].sum()) for r in plan[0]) == [16, 16]


def test_one_sample_per_bin_when_nothing_else_fits():
    # Bound 2 micro-batches, but two 6s and a 5 cannot share a bin of 10: the search ends at
    # one sample per bin, a plan it never had to try.
    assert plan_micro_batches(np.array([6, 6, 5]), 1, 10) == [[[0]], [[1]], [[2]]]
    assert plan_micro_batches_reference([6, 6, 5], 1, 10) == [[[0]], [[1]], [[2]]]


def test_all_samples_at_the_cap_each_get_a_bin():
    plan = plan_micro_batches(np.full(10, 64), 4, 64)
    assert len(plan) == 3
    check_plan(plan, np.full(10, 64), 4, 64)


def test_plan_is_deterministic_and_independent_of_input_type():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 500, size=300)
    first = plan_micro_batches(lengths, 4, 1000)
    assert plan_micro_batches(lengths.copy(), 4, 1000) == first
    assert plan_micro_batches(lengths.astype(np.int32), 4, 1000) == first
    assert plan_micro_batches(lengths.tolist(), 4, 1000) == first


def test_large_input_matches_reference_and_hits_the_bound_closely():
    # Exercises the guided search over m (the lower bound does not fit here).
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 20_000), 16, 2048).astype(np.int64)
    plan = plan_micro_batches(lengths, 8, 4096)
    bound = lower_bound_micro_batches(lengths, 8, 4096)
    assert check_plan(plan, lengths, 8, 4096) > bound
    assert len(plan) <= 1.02 * bound
    assert plan == plan_micro_batches_reference(lengths.tolist(), 8, 4096)


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([3, 11, 2], "position 1 has 11 tokens, more than max_tokens_per_rank=10"),
        ([3, 0], "position 1 has length 0"),
        ([[1, 2]], "1-D"),
        ([1.5, 2.0], "integers"),
    ],
)
def test_rejects_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        plan_micro_batches(np.array(lengths), 2, 10)


@pytest.mark.parametrize(("num_ranks", "cap"), [(0, 10), (2, 0), (2.0, 10), (True, 10)])
def test_rejects_bad_ranks_or_cap(num_ranks, cap):
    with pytest.raises(ValueError):
        plan_micro_batches(np.array([1, 2]), num_ranks, cap)


@st.composite
def packing_inputs(draw):
    cap = draw(st.integers(1, 300))
    num_ranks = draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["random", "equal", "at_cap", "tiny", "long_tail"]))
    n = draw(st.integers(0, 80))
    if kind == "random":
        lengths = draw(st.lists(st.integers(1, cap), min_size=n, max_size=n))
    elif kind == "equal":
        lengths = [draw(st.integers(1, cap))] * n
    elif kind == "at_cap":
        lengths = [cap] * n
    elif kind == "tiny":
        lengths = draw(st.lists(st.integers(1, max(1, cap // 20)), min_size=n, max_size=n))
    else:
        small = st.integers(1, max(1, cap // 10))
        large = st.integers(max(1, cap // 2), cap)
        lengths = draw(st.lists(st.one_of(small, small, small, large), min_size=n, max_size=n))
    return np.array(lengths, dtype=np.int64), num_ranks, cap


@settings(max_examples=300, deadline=None)
@given(packing_inputs())
def test_invariants_on_random_inputs(args):
    lengths, num_ranks, cap = args
    plan = plan_micro_batches(lengths, num_ranks, cap)
    check_plan(plan, lengths, num_ranks, cap)
    assert plan_micro_batches(lengths, num_ranks, cap) == plan
    assert plan_micro_batches_reference(lengths.tolist(), num_ranks, cap) == plan


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=60), st.integers(1, 8))
def test_everything_fits_in_one_micro_batch_when_the_cap_allows(lengths, num_ranks):
    lengths = np.array(lengths)
    cap = int(lengths.sum())
    plan = plan_micro_batches(lengths, num_ranks, cap)
    assert len(plan) == 1
    check_plan(plan, lengths, num_ranks, cap)
    # LPT bound: the most-loaded rank carries at most the mean plus the longest sample.
    loads = [int(lengths[r].sum()) for r in plan[0]]
    assert max(loads) <= cap / num_ranks + lengths.max()

"""BatchSampler and training modes: coverage per epoch, determinism, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mini_trainer.batching.sampler import (
    BatchSampler,
)


def take(sampler: BatchSampler, n: int) -> list:
    return [sampler.next_batch() for _ in range(n)]


@pytest.mark.parametrize(("num_samples", "batch_size"), [(10, 3), (12, 4), (5, 8), (1, 1)])
def test_every_sample_of_an_epoch_is_used_exactly_once(num_samples, batch_size):
    sampler = BatchSampler(num_samples, batch_size, seed=7)
    per_epoch = -(-num_samples // batch_size)
    assert sampler.batches_per_epoch == per_epoch
    for epoch in range(3):
        batches = take(sampler, per_epoch)
        assert [b.epoch for b in batches] == [epoch] * per_epoch
        assert [b.ends_epoch for b in batches] == [False] * (per_epoch - 1) + [True]
        seen = np.concatenate([b.indices for b in batches])
        assert sorted(seen.tolist()) == list(range(num_samples))
        # All batches full except possibly the last, which holds the remainder.
        sizes = [len(b.indices) for b in batches]
        assert sizes[:-1] == [batch_size] * (per_epoch - 1)
        assert sizes[-1] == num_samples - batch_size * (per_epoch - 1)
        assert all(b.indices.dtype == np.int64 for b in batches)
        assert (sampler.epoch, sampler.position) == (epoch + 1, 0)


def test_order_is_the_seeded_permutation_and_changes_per_epoch():
    sampler = BatchSampler(100, 25, seed=3)
    epoch0 = np.concatenate([b.indices for b in take(sampler, 4)])
    epoch1 = np.concatenate([b.indices for b in take(sampler, 4)])
    assert epoch0.tolist() == np.random.default_rng(3).permutation(100).tolist()
    assert epoch1.tolist() == np.random.default_rng(4).permutation(100).tolist()
    assert epoch0.tolist() != epoch1.tolist()
    other_seed = np.concatenate([b.indices for b in take(BatchSampler(100, 25, seed=4), 4)])
    assert other_seed.tolist() == epoch1.tolist()  # seed + epoch, nothing else


def test_restored_mid_epoch_continues_with_the_same_order():
    reference = BatchSampler(50, 7, seed=11)
    expected = take(reference, 20)  # runs into the third epoch
    for stop in (0, 3, 7, 8, 13):
        first = BatchSampler(50, 7, seed=11)
        take(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = BatchSampler(50, 7, seed=11)
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.position) == (first.epoch, first.position)
        rest = take(resumed, 20 - stop)
        for got, want in zip(rest, expected[stop:], strict=True):
            assert got.epoch == want.epoch
            assert got.ends_epoch == want.ends_epoch
            assert got.indices.tolist() == want.indices.tolist()


def test_state_dict_contents():
    sampler = BatchSampler(10, 4, seed=5)
    take(sampler, 2)
    assert sampler.state_dict() == {
        "epoch": 0,
        "position": 8,
        "num_samples": 10,
        "batch_size": 4,
        "seed": 5,
    }
    take(sampler, 1)
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 0


@pytest.mark.parametrize("key", ["num_samples", "batch_size", "seed"])
def test_load_state_dict_refuses_other_settings(key):
    state = BatchSampler(10, 4, seed=5).state_dict()
    state[key] += 1
    with pytest.raises(ValueError, match=key):
        BatchSampler(10, 4, seed=5).load_state_dict(state)


@pytest.mark.parametrize(("epoch", "position"), [(-1, 0), (0, 10), (0, -1), (None, 0), (0, 1.5)])
def test_load_state_dict_refuses_invalid_positions(epoch, position):
    state = {"epoch": epoch, "position": position, "num_samples": 10, "batch_size": 4, "seed": 5}
    with pytest.raises(ValueError, match="invalid"):
        BatchSampler(10, 4, seed=5).load_state_dict(state)


@pytest.mark.parametrize(
    "args", [(0, 1, 0), (1, 0, 0), (1, 1, -1), (1.5, 1, 0), (True, 1, 0), (4, 2, None)]
)
def test_constructor_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        BatchSampler(*args)

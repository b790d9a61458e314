"""Background step preparation: the same plans and rows as preparing each step in the loop."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from mini_trainer.batching.collator import collate_packed, plan_step
from mini_trainer.batching.sampler import BatchSampler
from mini_trainer.training.prefetch import StepPrefetcher


class ListDataset:
    """The dataset interface the loop uses: lengths, loss tokens, and samples by index."""

    def __init__(self, lengths):
        self.samples = [
            {"input_ids": list(range(1, n + 1)), "labels": [-100] + list(range(2, n + 1))}
            for n in lengths
        ]
        self.lengths = np.array(lengths)
        self.loss_tokens = np.array([n - 2 if n > 1 else 0 for n in lengths])
        self.read = 0

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        self.read += 1
        return self.samples[i]


def direct(batch, dataset, rank, world, cap):
    plan = plan_step(batch.indices, dataset.lengths, dataset.loss_tokens, world, cap)
    rows = [
        collate_packed([dataset[i] for i in ranks[rank]], plan.batch_num_loss_tokens, 0)
        for ranks in plan.micro_batches
    ]
    return plan, rows


@pytest.mark.parametrize("start_steps", [0, 4])  # 4: a sampler resumed in its second epoch
def test_same_batches_same_order_and_the_sampler_is_not_advanced(start_steps):
    rng = np.random.default_rng(0)
    dataset = ListDataset(rng.integers(1, 40, size=13).tolist())
    sampler = BatchSampler(len(dataset), 5, seed=3)
    for _ in range(start_steps):
        sampler.next_batch()
    reference = BatchSampler(len(dataset), 5, seed=3)
    reference.load_state_dict(sampler.state_dict())
    with StepPrefetcher(
        sampler, dataset, rank=1, world_size=2, max_tokens_per_rank=50, pad_id=0,
        pin_memory=False,
    ) as prefetcher:  # fmt: skip
        for _ in range(8):  # crosses epoch boundaries (3 batches per epoch)
            batch = sampler.next_batch()
            plan, rows = prefetcher.prepare(batch)
            want_plan, want_rows = direct(reference.next_batch(), dataset, 1, 2, 50)
            assert plan == want_plan
            assert len(rows) == len(want_rows)
            for got, want in zip(rows, want_rows, strict=True):
                for name in type(got).TENSORS:
                    assert torch.equal(getattr(got, name), getattr(want, name)), name
                assert got.seq_starts == want.seq_starts
            # The saved state is the loop's sampler: exactly the steps trained, not those ahead.
            assert sampler.state_dict() == reference.state_dict()


def test_an_error_surfaces_at_the_step_that_needs_the_batch():
    lengths = [10] * 6
    lengths[4] = 99  # over the cap; batch size 2 without shuffling effects: find its step
    dataset = ListDataset(lengths)
    sampler = BatchSampler(len(dataset), 2, seed=0)
    order = sampler.permutation(0).tolist()
    bad_step = order.index(4) // 2
    with StepPrefetcher(
        sampler, dataset, rank=0, world_size=1, max_tokens_per_rank=50, pad_id=0,
        pin_memory=False,
    ) as prefetcher:  # fmt: skip
        for _ in range(bad_step):
            prefetcher.prepare(sampler.next_batch())
        with pytest.raises(ValueError, match="sample 4 has 99 tokens"):
            prefetcher.prepare(sampler.next_batch())


def test_work_happens_ahead_and_close_is_prompt():
    dataset = ListDataset([5] * 40)
    sampler = BatchSampler(len(dataset), 4, seed=0)
    prefetcher = StepPrefetcher(
        sampler, dataset, rank=0, world_size=1, max_tokens_per_rank=50, pad_id=0,
        pin_memory=False, depth=2,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while dataset.read < 8 and time.monotonic() < deadline:  # two steps of 4, unasked
        time.sleep(0.01)
    assert dataset.read >= 8
    started = time.monotonic()
    prefetcher.close()
    assert time.monotonic() - started < 5
    assert dataset.read <= 4 * 3  # bounded: at most depth steps (plus one being built)

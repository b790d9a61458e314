"""Packed rows: exact fields, label alignment, plan_step, and equivalence on a tiny Llama."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mini_trainer.batching.collator import (
    IGNORE_INDEX,
    PackedMicroBatch,
    collate_packed,
    count_loss_tokens,
    plan_step,
)

X = IGNORE_INDEX


def test_collate_hand_example():
    samples = [
        {"input_ids": [11, 12, 13], "labels": [X, 12, 13]},
        {"input_ids": [21, 22], "labels": [21, 22]},
        {"input_ids": [31, 32, 33, 34], "labels": [X, X, 33, X]},
    ]
    mb = collate_packed(samples, batch_num_loss_tokens=17)
    assert isinstance(mb, PackedMicroBatch)
    assert mb.input_ids.tolist() == [[11, 12, 13, 21, 22, 31, 32, 33, 34]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    # Shifted within each sample; -100 at each sample's last position (never 21 or 31).
    assert mb.target_ids.tolist() == [[12, 13, X, 22, X, X, 33, X, X]]
    assert all(t.dtype == torch.long for t in (mb.input_ids, mb.position_ids, mb.target_ids))
    assert mb.num_loss_tokens == 4  # 12, 13, 22, 33; sample 2's first label 21 predicts nothing
    assert mb.num_loss_tokens == sum(count_loss_tokens(s["labels"]) for s in samples)
    assert mb.batch_num_loss_tokens == 17
    assert mb.num_tokens == 9
    assert mb.num_samples == 3
    assert mb.is_dummy is False
    # Boundaries and loss rows built on the host, for the attention and the loss.
    assert mb.seq_starts == [0, 3, 5, 9]
    assert mb.cu_seqlens.tolist() == [0, 3, 5, 9] and mb.cu_seqlens.dtype == torch.int32
    assert mb.max_seqlen == 4
    assert mb.loss_rows.tolist() == [0, 1, 3, 6]


def test_to_and_pin_memory_keep_every_field():
    samples = [{"input_ids": [1, 2, 3], "labels": [X, 2, 3]}, {"input_ids": [4], "labels": [4]}]
    mb = collate_packed(samples, batch_num_loss_tokens=2)
    moved = mb.to("cpu")
    for name in PackedMicroBatch.TENSORS:
        assert torch.equal(getattr(moved, name), getattr(mb, name)), name
    assert (moved.seq_starts, moved.max_seqlen) == ([0, 3, 4], 3)
    if torch.cuda.is_available():  # pinning needs a CUDA driver
        assert mb.pin_memory().input_ids.is_pinned()


def test_no_sample_predicts_the_next_samples_first_token():
    # Every label is a loss label: a naive concatenate-then-shift would train 3 -> 4 and 5 -> 6.
    samples = [
        {"input_ids": [1, 2, 3], "labels": [1, 2, 3]},
        {"input_ids": [4, 5], "labels": [4, 5]},
        {"input_ids": [6], "labels": [6]},
    ]
    mb = collate_packed(samples, batch_num_loss_tokens=3)
    ends = np.cumsum([len(s["input_ids"]) for s in samples]) - 1
    assert mb.target_ids[0, ends].tolist() == [X, X, X]
    assert mb.target_ids.tolist() == [[2, 3, X, 5, X, X]]


def test_dummy_row():
    mb = collate_packed([], batch_num_loss_tokens=42, pad_token_id=7)
    assert (mb.seq_starts, mb.cu_seqlens.tolist(), mb.max_seqlen) == ([0, 1], [0, 1], 1)
    assert mb.loss_rows.numel() == 0
    assert mb.input_ids.tolist() == [[7]]
    assert mb.position_ids.tolist() == [[0]]
    assert mb.target_ids.tolist() == [[X]]
    assert (mb.num_loss_tokens, mb.batch_num_loss_tokens, mb.num_tokens, mb.num_samples) == (
        0,
        42,
        0,
        0,
    )
    assert mb.is_dummy is True


def test_to_moves_tensors_and_keeps_counts():
    mb = collate_packed([{"input_ids": [1, 2], "labels": [1, 2]}], batch_num_loss_tokens=1)
    moved = mb.to("meta")
    assert moved.input_ids.device.type == "meta" and moved.target_ids.device.type == "meta"
    assert moved.position_ids.device.type == "meta"
    assert mb.input_ids.device.type == "cpu"  # a copy, the original is untouched
    assert (moved.num_loss_tokens, moved.num_tokens, moved.is_dummy) == (1, 2, False)


@pytest.mark.parametrize(
    ("sample", "match"),
    [({"input_ids": [], "labels": []}, "empty"), ({"input_ids": [1, 2], "labels": [1]}, "labels")],
)
def test_collate_rejects_malformed_samples(sample, match):
    with pytest.raises(ValueError, match=match):
        collate_packed([sample], batch_num_loss_tokens=1)


def test_count_loss_tokens():
    assert count_loss_tokens([5, 6, X, 7]) == 2  # position 0 never counts
    assert count_loss_tokens([X]) == 0
    assert count_loss_tokens([]) == 0


def test_plan_step_maps_positions_to_dataset_indices():
    lengths = np.array([100, 5, 60, 40, 70, 30, 10, 20])
    loss_tokens = np.array([9, 1, 2, 3, 4, 5, 6, 7])
    batch = np.array([4, 0, 2, 7, 3])  # lengths 70, 100, 60, 20, 40
    plan = plan_step(batch, lengths, loss_tokens, num_ranks=2, max_tokens_per_rank=100)
    assert plan.batch_num_loss_tokens == 4 + 9 + 2 + 7 + 3
    assert plan.num_tokens == 290
    assert plan.num_samples == 5
    assert plan.num_micro_batches == len(plan.micro_batches) == 2
    used = sorted(i for micro in plan.micro_batches for rank in micro for i in rank)
    assert used == sorted(batch.tolist())
    for micro in plan.micro_batches:
        assert len(micro) == 2
        assert all(lengths[rank].sum() <= 100 for rank in micro)
    assert plan.for_rank(1) == [micro[1] for micro in plan.micro_batches]
    again = plan_step(batch.copy(), lengths, loss_tokens, num_ranks=2, max_tokens_per_rank=100)
    assert again == plan


def test_plan_step_names_the_dataset_index_of_an_over_long_sample():
    with pytest.raises(ValueError, match="sample 6 has 300 tokens"):
        plan_step(np.array([1, 6]), np.arange(0, 800, 50), np.zeros(16), 2, 200)


# --- equivalence on a tiny Llama ------------------------------------------------------------

VOCAB = 100


def tiny_llama(attn_implementation: str) -> torch.nn.Module:
    model = helpers.tiny_llama(attn_implementation, vocab_size=VOCAB, max_position_embeddings=128)
    return model.eval()


def random_samples(seed: int, sizes: list[int]) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for k, size in enumerate(sizes):
        ids = torch.randint(1, VOCAB, (size,), generator=generator).tolist()
        labels = [X if torch.rand((), generator=generator) < 0.3 else t for t in ids]
        # Some first labels carry loss (as chat data whose sample starts with an assistant
        # token might): only a collator that shifts within samples ignores them correctly.
        labels[0] = ids[0] if k % 2 else X
        samples.append({"input_ids": ids, "labels": labels})
    return samples


def packed_loss_sum(model, mb: PackedMicroBatch) -> torch.Tensor:
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits
    return F.cross_entropy(
        logits.view(-1, VOCAB).float(),
        mb.target_ids.view(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    return tiny_llama(request.param)


@torch.no_grad()
def test_packed_logits_equal_each_sequence_alone(model):
    samples = random_samples(1, [7, 1, 13, 4, 20])
    mb = collate_packed(samples, batch_num_loss_tokens=0)
    packed = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits
    start = 0
    for sample in samples:
        alone = model(input_ids=torch.tensor([sample["input_ids"]]), use_cache=False).logits
        size = len(sample["input_ids"])
        torch.testing.assert_close(packed[0, start : start + size], alone[0], atol=1e-5, rtol=0)
        start += size
    assert start == mb.input_ids.shape[1]


@torch.no_grad()
def test_packed_loss_is_the_token_weighted_mean_of_per_sample_losses(model):
    samples = random_samples(2, [9, 15, 3, 11])
    counts = [count_loss_tokens(s["labels"]) for s in samples]
    mb = collate_packed(samples, batch_num_loss_tokens=sum(counts))
    packed = packed_loss_sum(model, mb) / mb.num_loss_tokens
    # Each sample alone through Hugging Face's own loss (its labels shifted by the model).
    per_sample = [
        model(
            input_ids=torch.tensor([s["input_ids"]]),
            labels=torch.tensor([s["labels"]]),
            use_cache=False,
        ).loss
        for s in samples
    ]
    expected = sum(loss * n for loss, n in zip(per_sample, counts, strict=True)) / sum(counts)
    assert mb.num_loss_tokens == sum(counts)
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=0)


@torch.no_grad()
def test_loss_is_the_same_token_mean_whatever_the_split(model):
    samples = random_samples(3, [12, 5, 30, 8, 17, 3, 25, 9, 14, 6])
    lengths = np.array([len(s["input_ids"]) for s in samples])
    loss_tokens = np.array([count_loss_tokens(s["labels"]) for s in samples])
    batch = np.arange(len(samples))[::-1].copy()

    def step_loss(num_ranks: int, cap: int) -> tuple[torch.Tensor, int]:
        plan = plan_step(batch, lengths, loss_tokens, num_ranks, cap)
        total = torch.zeros(())
        for micro in plan.micro_batches:
            for rank_indices in micro:  # ranks in turn, as the all-reduce would sum them
                mb = collate_packed([samples[i] for i in rank_indices], plan.batch_num_loss_tokens)
                total += packed_loss_sum(model, mb) / mb.batch_num_loss_tokens
        return total, plan.num_micro_batches

    one, count = step_loss(num_ranks=1, cap=int(lengths.sum()))
    assert count == 1
    for num_ranks, cap in [(1, 30), (2, 30), (3, 40), (16, 30)]:
        split, count = step_loss(num_ranks, cap)
        assert count > 1 or num_ranks > 1
        torch.testing.assert_close(split, one, atol=1e-5, rtol=0)

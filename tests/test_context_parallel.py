"""Context parallelism's pure parts, in process: the zig-zag split of a packed row, the keys
each query block sees, and chunk attention against the unsplit per-sample path (forward and
gradients, with windows, soft-caps, sinks and GQA). The real all-gather over gloo and the whole
model are checked by one torchrun job (test_context_parallel_ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, subprocess_env

from mini_trainer.batching.collator import collate_packed
from mini_trainer.batching.context_split import (
    ChunkLayout,
    row_from_chunks,
    split_row,
    zigzag_pieces,
)
from mini_trainer.distributed.context_groups import mesh_position
from mini_trainer.errors import UserError
from mini_trainer.training.context_attention import chunk_attention
from mini_trainer.training.packed_attention import packed_sdpa_attention
from mini_trainer.training_args import TrainingArgs, parse_training_args, to_cli_args


def _samples(lengths, vocab=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        out.append({"input_ids": ids, "labels": [-100 if i < 2 else t for i, t in enumerate(ids)]})
    return out


ROWS = {
    "several documents, crossing every boundary": [5, 7, 3, 10, 5],
    "one document longer than a chunk": [23, 4],
    "short last batch (mostly padding)": [3],
    "one document exactly the row": [16],
}


def test_the_flag_round_trips_and_refuses_what_is_not_supported_in_one_line_each():
    base = {"model_name_or_path": "m", "data_path": "d", "output_dir": "o"}
    args = TrainingArgs(**base, context_parallel=4, max_tokens_per_gpu=100)
    assert parse_training_args(to_cli_args(args)) == args and args.row_tokens == 400
    with pytest.raises(UserError) as refused:
        TrainingArgs(**base, context_parallel=2, compile=True, validation_data_path="v")
    assert refused.value.lines == [
        "--context-parallel: not with --compile (not supported yet)",
        "--context-parallel: not with --validation-data-path (not supported yet)",
    ]
    assert [mesh_position(r, 6, 3) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0),
                                                          (1, 1), (1, 2)]  # fmt: skip
    with pytest.raises(UserError, match="must be a multiple"):
        mesh_position(0, 6, 4)


def test_zigzag_gives_each_rank_an_early_and_a_late_piece():
    assert [zigzag_pieces(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert sorted(p for r in range(3) for p in zigzag_pieces(3, r)) == list(range(6))


@pytest.mark.parametrize("cp", [1, 3, 4])
@pytest.mark.parametrize("lengths", ROWS.values(), ids=ROWS.keys())
def test_split_row_keeps_every_token_once_with_its_position_and_target(cp, lengths):
    row = collate_packed(_samples(lengths), batch_num_loss_tokens=99, pad_token_id=0)
    chunks = [split_row(row, cp, r, pad_token_id=0) for r in range(cp)]
    tokens = row.input_ids.shape[1]
    p = chunks[0].context.piece_len
    assert 2 * cp * p >= tokens > 2 * cp * (p - 1)
    for name in ("input_ids", "position_ids", "target_ids"):
        whole = row_from_chunks([getattr(c, name) for c in chunks], p, dim=1)
        assert torch.equal(whole[:, :tokens], getattr(row, name)), name
        if name == "target_ids":
            assert (whole[0, tokens:] == -100).all()
    # positions continue per document across the pieces: the padding is one more document
    padded_positions = row_from_chunks([c.position_ids for c in chunks], p, dim=1)[0, tokens:]
    assert padded_positions.tolist() == list(range(2 * cp * p - tokens))
    assert sum(c.num_loss_tokens for c in chunks) == row.num_loss_tokens
    assert sum(c.num_tokens for c in chunks) == row.num_tokens
    assert {c.batch_num_loss_tokens for c in chunks} == {99}
    for chunk in chunks:
        assert torch.equal(chunk.loss_rows, torch.nonzero(chunk.target_ids[0] != -100).flatten())


@pytest.mark.parametrize("window", [None, 3])
def test_segments_cover_the_chunk_and_see_exactly_their_document(window):
    layout = ChunkLayout(cp_size=2, cp_rank=1, piece_len=5, doc_bounds=(0, 4, 13, 17, 20))
    segments = layout.segments(window)
    assert [s.q_start for s in segments] == [0] + [s.q_end for s in segments[:-1]]
    assert segments[-1].q_end == 10
    index = layout.global_index().tolist()
    assert index == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    for s in segments:
        doc = layout.document_of(s.q_global)
        first_key = layout.doc_bounds[doc]
        if window is not None:
            first_key = max(first_key, s.q_global - window + 1)
        assert s.k_start == first_key
        assert s.k_end == index[s.q_end - 1] + 1
        assert layout.document_of(s.k_end - 1) == doc


class _Module(torch.nn.Module):
    pass


def _reference(q, k, v, bounds, window, softcap, sinks):
    """The unsplit per-sample path: (1, T, H, D)."""
    module = _Module().eval()
    out, _ = packed_sdpa_attention(
        module, q, k, v, None, position_ids=torch.zeros(1, q.shape[2], dtype=torch.long),
        packed_bounds=[bounds], sliding_window=window, softcap=softcap, s_aux=sinks,
    )  # fmt: skip
    return out


FEATURES = {
    "causal": {},
    "window": {"window": 4},
    "softcap": {"softcap": 0.7},
    "sinks and window": {"sinks": True, "window": 5},
    "value head size apart (MLA)": {"v_dim": 6},
}


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("lengths", ROWS.values(), ids=ROWS.keys())
def test_chunk_attention_equals_the_unsplit_row_in_values_and_gradients(cp, lengths):
    """Every rank's chunk against the gathered row (gathered here by `row_from_chunks`, as the
    all-gather delivers it): outputs and q/k/v/sink gradients equal the per-sample path's."""
    for features in FEATURES.values():
        _check_chunk_attention(cp, features, lengths)


def _check_chunk_attention(cp, features, lengths):
    torch.manual_seed(0)
    row = collate_packed(_samples(lengths), 1)
    tokens = row.input_ids.shape[1]
    heads, kv_heads, dim, v_dim = 4, 2, 8, features.get("v_dim", 8)
    q, k, v = (torch.randn(1, h, tokens, d, dtype=torch.float64, requires_grad=True)
               for h, d in ((heads, dim), (kv_heads, dim), (kv_heads, v_dim)))  # fmt: skip
    sinks = torch.randn(heads, dtype=torch.float64, requires_grad=True)
    window, softcap = features.get("window"), features.get("softcap")
    use_sinks = sinks if features.get("sinks") else None
    want = _reference(q, k, v, row.seq_starts, window, softcap, use_sinks)
    weights = torch.randn_like(want)
    want_grads = torch.autograd.grad((want * weights).sum(), [q, k, v, sinks], allow_unused=True)

    layouts = [split_row(row, cp, r).context for r in range(cp)]
    p = layouts[0].piece_len
    pad = 2 * cp * p - tokens

    def padded(x):
        return torch.cat([x, x.new_zeros(*x.shape[:2], pad, x.shape[3])], dim=2)

    index = [layout.global_index() for layout in layouts]
    # each rank's own keys and values, then "gathered" into row order
    k_row = row_from_chunks([padded(k).index_select(2, i) for i in index], p)
    v_row = row_from_chunks([padded(v).index_select(2, i) for i in index], p)
    outs = [
        chunk_attention(padded(q).index_select(2, i), k_row, v_row, layout, window=window,
                        softcap=softcap, sinks=use_sinks).transpose(1, 2)
        for layout, i in zip(layouts, index, strict=True)
    ]  # fmt: skip
    got = row_from_chunks(outs, p, dim=1)[:, :tokens]
    # fp64 throughout, but `explicit_attention` takes its softmax in fp32 (as on one GPU)
    tol = 1e-6 if softcap is not None or use_sinks is not None else 1e-12
    assert (got - want).norm() <= tol * want.norm()
    got_grads = torch.autograd.grad((got * weights).sum(), [q, k, v, sinks], allow_unused=True)
    for name, g, w in zip("qkvs", got_grads, want_grads, strict=True):
        if w is None:
            assert g is None, name
            continue
        assert (g - w).norm() <= tol * w.norm(), name


@pytest.mark.slow
def test_context_parallel_ranks(tmp_path):
    """One 4-rank torchrun job (gloo): CP 2 (dp 2 x cp 2) and CP 4 against CP 1 for several
    families and rows, per-sample losses and every gradient within 1e-6 relative; then the
    training loop (4 steps, export, a CP 2 state resumed on CP 4) against CP 1; see
    tests/context_ranks.py."""
    out = tmp_path / "errors.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", str(REPO_ROOT / "tests" / "context_ranks.py"),
               str(out), str(tmp_path / "models")]  # fmt: skip
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(out.read_text())
    assert len(errors) == 26, errors  # 3 families x 4 rows x CP 2 and 4, the engine, its resume
    assert "engine: CP 2's state resumed on CP 4" in errors
    for case, (loss_error, worst) in errors.items():
        assert loss_error <= 1e-6, (case, loss_error)
        assert worst[0][1] <= 1e-6, (case, worst)

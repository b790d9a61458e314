"""Context parallelism's split of one packed row over a group of N ranks (`--context-parallel N`).

A DP group's packed row (`collate_packed`, up to N x `--max-tokens-per-gpu` tokens) is padded
to a multiple of 2N and cut into 2N equal pieces; rank r of the group takes pieces r and
2N - 1 - r ("zig-zag"). Causal attention costs more late in the row than early, and each rank
holds one early and one late piece, so the attention work is balanced whatever the documents.

Nothing about the row changes but where its tokens sit: position ids come from the whole row,
so they continue across pieces per document (rotary is unchanged); the targets were shifted
within each sample before the split, so each token's loss needs its own hidden state only. The
padding is one extra document at the row's end (pad tokens, target -100): it attends only to
itself and adds no loss.

`ChunkLayout` is what the chunk's attention needs (training/context_attention.py): which global
positions its queries are, and the row's document bounds, from which `segments` derives, per
document and piece, the keys each query block sees. All of it is host memory: no device sync.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import torch

from mini_trainer.batching.collator import PackedMicroBatch
from mini_trainer.labels import IGNORE_INDEX


@dataclass(frozen=True)
class Segment:
    """One document's queries inside one piece, and the keys they see (whole-row positions)."""

    q_start: int
    """First query, in the chunk's local order."""
    q_end: int
    """One past the last query, local."""
    q_global: int
    """The first query's position in the whole row."""
    k_start: int
    """First key in the whole row: the document's start, or the window's first key."""
    k_end: int
    """One past the last key: the last query's own position + 1."""


@dataclass(frozen=True)
class ChunkLayout:
    """Where one rank's chunk sits in its group's row."""

    cp_size: int
    """N, ranks in the group (>= 1)."""
    cp_rank: int
    """This rank's place in the group, 0 <= cp_rank < N."""
    piece_len: int
    """P, tokens per piece; the chunk holds 2P, the padded row 2NP."""
    doc_bounds: tuple[int, ...]
    """[0, s1, ..., T, 2NP]: the row's documents, the padding (if any) one more at the end."""

    def __post_init__(self) -> None:
        if not 0 <= self.cp_rank < self.cp_size or self.piece_len < 1:
            raise ValueError(f"bad chunk layout: {self}")
        if self.doc_bounds[0] != 0 or self.doc_bounds[-1] != self.row_len:
            raise ValueError(f"document bounds {self.doc_bounds} do not cover {self.row_len}")

    @property
    def row_len(self) -> int:
        return 2 * self.cp_size * self.piece_len

    @property
    def pieces(self) -> tuple[int, int]:
        """The two pieces this rank holds, in its local order."""
        return zigzag_pieces(self.cp_size, self.cp_rank)

    def global_index(self) -> torch.Tensor:
        """(2P,) int64: each local token's position in the padded row."""
        p = self.piece_len
        return torch.cat([torch.arange(i * p, (i + 1) * p) for i in self.pieces])

    def document_of(self, position: int) -> int:
        """Which document (0-based; the padding is the last) holds row position `position`."""
        return bisect.bisect_right(self.doc_bounds, position) - 1

    def segments(self, window: int | None = None) -> list[Segment]:
        """The chunk's queries cut at document bounds, in local order, with the keys each block
        sees: from its document's start (or, with a sliding window of W, W - 1 keys before the
        block's first query, as `window_mask`) to the block's last query."""
        out = []
        p = self.piece_len
        for local, piece in enumerate(self.pieces):
            g0, g1 = piece * p, (piece + 1) * p
            first = self.document_of(g0)
            for doc in range(first, len(self.doc_bounds) - 1):
                s, e = self.doc_bounds[doc], self.doc_bounds[doc + 1]
                if s >= g1:
                    break
                a, b = max(s, g0), min(e, g1)
                k0 = s if window is None else max(s, a - window + 1)
                out.append(Segment(local * p + a - g0, local * p + b - g0, a, k0, b))
        return out


def zigzag_pieces(cp_size: int, cp_rank: int) -> tuple[int, int]:
    """Rank r of N holds pieces r and 2N - 1 - r of the row's 2N."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def piece_length(row_tokens: int, cp_size: int) -> int:
    """P: the row padded up to a multiple of 2N, over 2N."""
    return -(-row_tokens // (2 * cp_size))


def row_from_chunks(chunks: list[torch.Tensor], piece_len: int, dim: int = 2) -> torch.Tensor:
    """The whole row in its own order from every rank's chunk (`chunks[r]`, local order along
    `dim`), e.g. the gathered keys: piece i < N is the first half of rank i's chunk, piece
    i >= N the second half of rank 2N - 1 - i's."""
    n = len(chunks)
    firsts = [chunk.narrow(dim, 0, piece_len) for chunk in chunks]
    seconds = [chunks[2 * n - 1 - i].narrow(dim, piece_len, piece_len) for i in range(n, 2 * n)]
    return torch.cat(firsts + seconds, dim=dim)


def split_row(
    micro: PackedMicroBatch, cp_size: int, cp_rank: int, pad_token_id: int = 0
) -> PackedMicroBatch:
    """Rank `cp_rank`'s chunk of the group's packed row `micro` (one row), `context` set.

    The chunk keeps the row's `batch_num_loss_tokens` (the loss divisor stays the global
    batch's), counts its own loss tokens and real tokens, and carries `seq_starts` [0, 2P]:
    context-parallel attention reads `context`, never the row's per-sample bounds.
    """
    if micro.input_ids.shape[0] != 1:
        raise ValueError("split_row: one packed row at a time")
    tokens = micro.input_ids.shape[1]
    p = piece_length(tokens, cp_size)
    pad = 2 * cp_size * p - tokens
    bounds = list(micro.seq_starts) + ([tokens + pad] if pad else [])
    layout = ChunkLayout(cp_size, cp_rank, p, tuple(bounds))
    index = layout.global_index()

    def take(row: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
        return torch.cat([row[0], fill]).index_select(0, index).unsqueeze(0)

    pad_ids = torch.full((pad,), pad_token_id, dtype=torch.long)
    targets = take(micro.target_ids, torch.full((pad,), IGNORE_INDEX, dtype=torch.long))
    loss_rows = torch.nonzero(targets[0] != IGNORE_INDEX).flatten()
    real = 0 if micro.is_dummy else int((index < tokens).sum())
    return replace(
        micro,
        input_ids=take(micro.input_ids, pad_ids),
        position_ids=take(micro.position_ids, torch.arange(pad, dtype=torch.long)),
        target_ids=targets,
        num_loss_tokens=int(loss_rows.numel()),
        num_tokens=real,
        seq_starts=[0, 2 * p],
        cu_seqlens=torch.tensor([0, 2 * p], dtype=torch.int32),
        max_seqlen=2 * p,
        loss_rows=loss_rows,
        context=layout,
    )

"""Plan, read, parse and collate the next steps' micro-batches while the current step computes.

The step plan is a pure function of the sampler's batches, so it can be computed ahead: a
background thread walks its OWN copy of the sampler, plans each step (`plan_step`), reads and
parses this rank's samples and packs them (`collate_packed`), in pinned host memory on CUDA so
the copies to the device are asynchronous. The training loop's sampler stays the one that is
saved in checkpoints: it advances only when a step starts, exactly as without prefetching, so a
resume or a stop never skips what the thread had prepared but was not trained on. Each step the
loop checks that the thread's batch is the sampler's batch (same indices, same order).

An error in the thread (an unreadable line, a sample over the token cap) is raised in the loop
when it reaches the step that needed the failed batch, as it would have been without prefetching.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np
import torch

from mini_trainer.batching.collator import PackedMicroBatch, StepPlan, collate_packed, plan_step
from mini_trainer.batching.context_split import split_row
from mini_trainer.batching.sampler import BatchSampler, GlobalBatch

DEFAULT_DEPTH = 2
"""Steps prepared ahead of the one running: enough to hide one slow read."""


class StepPrefetcher:
    """Yields `(plan, this rank's host micro-batches)` for each global batch, in order."""

    def __init__(
        self,
        sampler: BatchSampler,
        dataset,
        *,
        rank: int,
        world_size: int,
        max_tokens_per_rank: int,
        pad_id: int,
        pin_memory: bool,
        device=None,
        depth: int = DEFAULT_DEPTH,
        context_split: tuple[int, int] | None = None,
    ):
        """`pin_memory` (CUDA only) pins the rows for `device`, this rank's GPU. With
        `context_split` (N, place in the group), `rank`, `world_size` and `max_tokens_per_rank`
        are the context-parallel group's (its index, the number of groups, N x the rank cap)
        and each row is cut to this rank's zig-zag chunk."""
        self._ahead = BatchSampler(sampler.num_samples, sampler.batch_size, sampler.seed)
        self._ahead.load_state_dict(sampler.state_dict())
        self._dataset = dataset
        self._rank = rank
        self._world_size = world_size
        self._cap = max_tokens_per_rank
        self._pad_id = pad_id
        self._pin = pin_memory
        self._device = device
        self._split = context_split
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mini-trainer-prefetch", daemon=True)
        self._thread.start()

    def prepare(self, batch: GlobalBatch) -> tuple[StepPlan, list[PackedMicroBatch]]:
        """This step's plan and micro-batches; `batch` is the loop's sampler's batch."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        ahead_batch, plan, micro_batches = item
        if ahead_batch.epoch != batch.epoch or not np.array_equal(
            ahead_batch.indices, batch.indices
        ):
            raise RuntimeError("prefetch is out of step with the sampler (a bug)")
        return plan, micro_batches

    def close(self) -> None:
        """Stop the thread and drop what it prepared ahead."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread.join()

    def __enter__(self) -> StepPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        try:
            if self._pin and self._device is not None:
                # A thread starts on GPU 0: pinning there would open a context on another
                # rank's GPU (what DataLoader's pin thread avoids the same way).
                torch.cuda.set_device(self._device)
            while not self._stop.is_set():
                self._put(self._next_step())
        except BaseException as error:  # handed to the loop, raised at the step that needed it
            self._put(error)

    def _next_step(self):
        batch = self._ahead.next_batch()
        plan = plan_step(
            batch.indices,
            self._dataset.lengths,
            self._dataset.loss_tokens,
            self._world_size,
            self._cap,
        )
        micro_batches = [
            collate_packed(
                [self._dataset[i] for i in ranks[self._rank]], plan.batch_num_loss_tokens,
                self._pad_id,
            )
            for ranks in plan.micro_batches
        ]  # fmt: skip
        if self._split is not None:
            size, place = self._split
            micro_batches = [split_row(m, size, place, self._pad_id) for m in micro_batches]
        if self._pin:
            micro_batches = [micro.pin_memory() for micro in micro_batches]
        return batch, plan, micro_batches

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

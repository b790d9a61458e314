"""The data phase of a run: the index-backed dataset every rank reads samples through."""

from __future__ import annotations

from mini_trainer.errors import UserError
from mini_trainer.training_args import TrainingArgs


def load_dataset(args: TrainingArgs, runtime):
    """The index-backed dataset; without --data-index, rank 0 builds the index (same checks)."""
    from mini_trainer.data.dataset import IndexedJsonlDataset
    from mini_trainer.data.index_file import read_index_metadata
    from mini_trainer.data.validate import build_index, read_vocab_size
    from mini_trainer.training.distributed import broadcast_object

    if args.data_index:
        dataset = IndexedJsonlDataset.open(args.data_path, args.data_index)
        checked = read_index_metadata(args.data_index).get("vocab_size")
        model_vocab = read_vocab_size(args.model_name_or_path)
        if checked is None or checked > model_vocab:
            raise UserError(
                f"{args.data_index}: --data-index: token ids were checked against a vocabulary "
                f"of {checked}, but the model has {model_vocab} (validate with this model)"
            )
        longest = int(dataset.lengths.max())
        if longest > args.max_tokens_per_gpu:
            raise UserError(
                f"{args.data_index}: --data-index: holds a {longest}-token sample, more than "
                f"--max-tokens-per-gpu {args.max_tokens_per_gpu} (validate with that cap)"
            )
        return dataset
    outcome = None
    if runtime.is_main:
        try:
            vocab_size = read_vocab_size(args.model_name_or_path)
            index, _ = build_index(args.data_path, vocab_size, args.max_tokens_per_gpu)
            outcome = ("ok", index)
        except UserError as error:
            hint = (
                "to skip samples over the cap: mini-trainer validate DATA --on-long drop "
                "--out-index F.parquet ..., then train with --data-index F.parquet"
            )
            long_samples = any("more than --max-tokens-per-gpu" in line for line in error.lines)
            outcome = ("error", [*error.lines, hint] if long_samples else error.lines)
    status, payload = broadcast_object(outcome, runtime)
    if status == "error":
        raise UserError(*payload)
    return IndexedJsonlDataset(args.data_path, payload)

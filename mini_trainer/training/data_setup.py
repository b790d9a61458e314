"""The data phase of a run: the index-backed dataset every rank reads samples through."""

from __future__ import annotations

from mini_trainer.data.dataset import IndexedJsonlDataset
from mini_trainer.data.index_file import index_fit_problem, read_index_metadata
from mini_trainer.data.validate import build_index, read_vocab_size
from mini_trainer.distributed.runtime import decided_on_main
from mini_trainer.errors import UserError
from mini_trainer.training_args import TrainingArgs


def load_dataset(args: TrainingArgs, runtime):
    """The index-backed dataset; without --data-index, rank 0 builds the index.

    Whether an index fits this run (model vocabulary, token cap) is `index_fit_problem`'s rule;
    an index built here fits by construction (`build_index` applies the same two limits).
    """
    vocab_size = read_vocab_size(args.model_name_or_path)  # every line read is checked against it
    if args.data_index:
        dataset = IndexedJsonlDataset.open(args.data_path, args.data_index, vocab_size)
        problem = index_fit_problem(
            read_index_metadata(args.data_index),
            int(dataset.lengths.max()),
            vocab_size,
            args.row_tokens,
        )
        if problem:
            raise UserError(f"{args.data_index}: --data-index: {problem}")
        return dataset
    cap = "--max-tokens-per-gpu"
    if args.context_parallel > 1:  # a group's row: validate with the group's budget
        cap = f"--max-tokens-per-gpu x --context-parallel ({args.row_tokens})"
    hint = (
        f"samples longer than {cap}: {{count}}; to train without them, "
        f"run mini-trainer validate {args.data_path} --on-long drop --out-index F.parquet "
        f"(with --model as here and --max-tokens-per-gpu {args.row_tokens}), then train with "
        "--data-index F.parquet"
    )

    def index_on_main():
        return build_index(
            args.data_path, vocab_size, args.row_tokens, long_hint=hint, outcome=None
        )[0]

    index = decided_on_main(index_on_main, runtime)
    return IndexedJsonlDataset(args.data_path, index, vocab_size)

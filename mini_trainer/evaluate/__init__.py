"""`mini-trainer evaluate`: held-out metrics of a checkpoint on pre-tokenized JSONL.

- `stats`: chunked loss, token accuracy and exact match over the LM head (no full logits).
- `runner`: validation, planning, the sharded model and the all-reduce; `evaluate_model`.
- `lm_eval_tasks`: optional lm-evaluation-harness tasks (the `eval` extra), offline.
- `command`: the subcommand's body (check, evaluate, write the JSON atomically).

Nothing is imported here, so `mini-trainer --help` does not pay for torch.
"""

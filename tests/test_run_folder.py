"""The run folder: what `classify` finds in hand-made folders, what each `--resume` mode may do
with it (`start_decision`), moving an unsaved attempt aside, state checksums, the checkpoint
policy and the trainer state's schema. Real DCP files, no process group, no torchrun."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO_ROOT, base_flags, run_cli

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.errors import UserError
from mini_trainer.training.checkpoint_policy import Due, checkpoints_due
from mini_trainer.training.resume import choose_state, shared_verdicts
from mini_trainer.training.run_folder import (
    MOVE_ASIDE,
    RESUME,
    START,
    STOPPED_BY_ERROR,
    Kind,
    classify,
    damage,
    move_aside,
    start_decision,
)
from mini_trainer.training.state_checksums import CHECKSUMS, write_checksums
from mini_trainer.training.trainer_state import (
    TRAINER_STATE,
    Progress,
    TornTrainerState,
    TrainerState,
)
from mini_trainer.training_args import TrainingArgs, parse_training_args, to_cli_args

LONE = Runtime(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def save_state(out, step, checksums=True, world=2):
    """A real single-process DCP state, with trainer state, RNG files and (schema 2) checksums."""
    import torch.distributed.checkpoint as dcp

    path = out / "state" / f"step_{step}"
    path.mkdir(parents=True)
    with warnings.catch_warnings():  # "no process group: saving from a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": torch.arange(4096.0) + step}}, checkpoint_id=str(path))
    for rank in range(world):
        torch.save({"torch": torch.get_rng_state()}, path / f"rng_rank{rank}.pt")
    if checksums:
        trainer_state = TrainerState(progress=Progress(step=step))
        (path / TRAINER_STATE).write_text(trainer_state.to_json())
        write_checksums(path, LONE)
    else:  # as an older mini-trainer wrote it: no version, no checksums
        (path / TRAINER_STATE).write_text(json.dumps({"progress": {"step": step}}))
    return path


def shard_of(state):
    return next(state.glob("*.distcp"))


def flip_bytes(path, offset=-100):
    """Change 4 bytes inside the file, keeping its size (what the size check cannot see)."""
    data = bytearray(path.read_bytes())
    for i in range(4):
        data[offset + i] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- classify


def test_fresh_folders(tmp_path):
    assert classify(tmp_path / "missing").kind is Kind.FRESH
    (tmp_path / "only_args").mkdir()
    (tmp_path / "only_args" / "training_args.json").write_text("{}")
    assert classify(tmp_path / "only_args") == classify(tmp_path / "only_args")
    assert classify(tmp_path / "only_args").kind is Kind.FRESH
    assert not classify(tmp_path / "only_args").started
    (tmp_path / "empty_metrics").mkdir()
    (tmp_path / "empty_metrics" / "metrics.jsonl").write_text("")
    folder = classify(tmp_path / "empty_metrics")
    assert folder.kind is Kind.FRESH and folder.started


@pytest.mark.parametrize("leftover", ["metrics", "hf_format"])
def test_an_attempt_without_state_is_unsaved(tmp_path, leftover):
    if leftover == "metrics":
        (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    else:
        (tmp_path / "hf_format" / "samples_32").mkdir(parents=True)
    (tmp_path / "state").mkdir()  # an empty state/ (a save that never published) is no state
    folder = classify(tmp_path)
    assert folder.kind is Kind.UNSAVED
    assert folder.steps == (2 if leftover == "metrics" else 0)


def test_final_without_state_is_finished(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert classify(tmp_path).kind is Kind.FINISHED


def test_the_newest_intact_state_is_the_one_to_resume(tmp_path):
    save_state(tmp_path, 2)
    good = save_state(tmp_path, 4)
    (tmp_path / "state" / ".step_6.tmp-123").mkdir()  # an interrupted save
    (tmp_path / "state" / "step_x").mkdir()
    newest = save_state(tmp_path, 8)
    (newest / TRAINER_STATE).write_text("")  # torn
    folder = classify(tmp_path)
    assert folder.kind is Kind.RESUMABLE and folder.state == good
    assert [path for path, _ in folder.damaged] == [newest]
    assert "trainer_state.json does not load" in folder.damaged[0][1]


def test_all_states_damaged(tmp_path):
    for step in (2, 4):
        state = save_state(tmp_path, step)
        shard_of(state).write_bytes(shard_of(state).read_bytes()[:20])
    folder = classify(tmp_path)
    assert folder.kind is Kind.DAMAGED and folder.state is None
    assert [path.name for path, _ in folder.damaged] == ["step_4", "step_2"]


# ---------------------------------------------------------------- checksums


def test_a_same_size_change_inside_a_shard_is_damage_and_resume_falls_back(tmp_path):
    older = save_state(tmp_path, 2)
    newest = save_state(tmp_path, 4)
    assert damage(newest) is None
    assert set(json.loads((newest / CHECKSUMS).read_text())["files"]) == {
        path.name for path in newest.iterdir() if path.name != CHECKSUMS
    }
    shard = shard_of(newest)
    size = shard.stat().st_size
    flip_bytes(shard)
    assert shard.stat().st_size == size
    assert damage(newest, verify_contents=False) is None  # sizes and small files: all fine
    assert damage(newest) == f"{shard.name}: content differs from {CHECKSUMS} (xxh3_64)"
    assert choose_state(tmp_path, None) == older
    assert (tmp_path / "state" / ".damaged-step_4").is_dir() and not newest.exists()


def test_a_state_checksummed_with_sha256_by_an_earlier_version_is_still_verified(tmp_path):
    state = save_state(tmp_path, 2)
    table = json.loads((state / CHECKSUMS).read_text())
    assert table["algorithm"] == "xxh3_64"
    table["algorithm"] = "sha256"
    for name, entry in table["files"].items():
        entry["sha256"] = hashlib.sha256((state / name).read_bytes()).hexdigest()
        del entry["xxh3_64"]
    (state / CHECKSUMS).write_text(json.dumps(table))
    assert damage(state) is None
    flip_bytes(shard_of(state))
    assert damage(state) == f"{shard_of(state).name}: content differs from {CHECKSUMS} (sha256)"
    table["algorithm"] = "md4"
    (state / CHECKSUMS).write_text(json.dumps(table))
    assert damage(state) == f"{CHECKSUMS}: unknown algorithm 'md4'"


def test_a_mismatch_another_rank_found_is_the_same_fallback_and_refusal(tmp_path):
    """`choose_state` takes the verdicts every rank found together (`shared_verdicts`): a state
    intact to rank 0 but not to another rank is moved aside as rank 0's own finding would be;
    with no state intact to every rank, the resume is refused."""
    older, newest = save_state(tmp_path, 2), save_state(tmp_path, 4)
    assert shared_verdicts(tmp_path, None) == {newest: None}  # this process alone: all fine
    seen = f"{shard_of(newest).name}: content differs from {CHECKSUMS} (xxh3_64) (seen by rank 1)"
    assert choose_state(tmp_path, None, True, {newest: seen, older: None}) == older
    assert (tmp_path / "state" / ".damaged-step_4").is_dir()
    with pytest.raises(UserError) as refused:
        choose_state(tmp_path, None, True, {older: "x (seen by rank 3)"})
    assert refused.value.lines[0] == f"{older}: damaged: x (seen by rank 3)"
    flip_bytes(shard_of(older))
    assert shared_verdicts(tmp_path, None) == {
        older: f"{shard_of(older).name}: content differs from {CHECKSUMS} (xxh3_64)"
    }


def _verify_on_rank(rank: int, world: int, init_file: str, folder: str, results: str) -> None:
    """One rank of `test_every_rank_verifies_its_share_of_a_state` (spawned)."""
    import torch.distributed as dist

    from mini_trainer.training.state_checksums import verify_shared

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)  # fmt: skip
    runtime = Runtime(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))
    try:
        answer = verify_shared(Path(folder), runtime)
    finally:
        dist.destroy_process_group()
    (Path(results) / f"rank{rank}.json").write_text(json.dumps(answer))


@pytest.mark.slow
def test_every_rank_verifies_its_share_of_a_state(tmp_path):
    """Two gloo ranks share the hashing as at save (biggest first, every other file): a file in
    rank 1's share that differs is rank 1's finding, and both ranks give the same answer."""
    import torch.multiprocessing as mp

    state = save_state(tmp_path / "run", 2)
    table = json.loads((state / CHECKSUMS).read_text())["files"]
    ordered = sorted(table, key=lambda name: (-table[name]["size"], name))
    flip_bytes(state / ordered[1], offset=0)  # the second biggest: rank 1's share
    results = tmp_path / "results"
    results.mkdir()
    mp.spawn(_verify_on_rank, args=(2, str(tmp_path / "init"), str(state), str(results)),
             nprocs=2)  # fmt: skip
    answers = {json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    assert answers == {f"{ordered[1]}: content differs from {CHECKSUMS} (xxh3_64) (seen by rank 1)"}


def test_missing_checksums_damage_a_new_state_but_not_an_old_one(tmp_path):
    new = save_state(tmp_path / "new", 2)
    (new / CHECKSUMS).unlink()
    assert damage(new) == f"{CHECKSUMS} is missing"
    old = save_state(tmp_path / "old", 2, checksums=False)
    assert damage(old) is None


# ---------------------------------------------------------------- what each mode does


def folder_of(kind, **facts):
    """A classification as `classify` would return it (the decision is a pure function of it)."""
    base = {"path": "OUT", "kind": kind, "state": None, "damaged": (), "steps": 3, "exports": (),
            "started": kind is not Kind.FRESH, "stopped_by_error": False}  # fmt: skip
    return SimpleNamespace(**{**base, **facts})


@pytest.mark.parametrize(
    ("kind", "mode", "expected"),
    [
        (Kind.FRESH, False, START), (Kind.FRESH, True, START), (Kind.FRESH, "auto", START),
        (Kind.RESUMABLE, False, "already holds a training run (pass --resume to continue it"),
        (Kind.RESUMABLE, True, RESUME), (Kind.RESUMABLE, "auto", RESUME),
        (Kind.UNSAVED, False, "saved no state to continue from: pass --resume auto"),
        (Kind.UNSAVED, True, "holds a run (metrics.jsonl has 3 steps) but no saved state"),
        (Kind.UNSAVED, "auto", MOVE_ASIDE),
        (Kind.FINISHED, False, "already holds a training run"),
        (Kind.FINISHED, True, "holds a run (metrics.jsonl has 3 steps) but no saved state to "
                              "continue from (it finished: final/ exists)"),
        (Kind.FINISHED, "auto", "(it finished: final/ exists); use a new --output-dir"),
        (Kind.DAMAGED, False, "already holds a training run"),
        (Kind.DAMAGED, True, "OUT: --resume: no intact state to continue from"),
        (Kind.DAMAGED, "auto", "OUT: --resume: no intact state to continue from"),
    ],
)  # fmt: skip
def test_start_decision(kind, mode, expected):
    folder = folder_of(kind)
    if expected in (START, RESUME, MOVE_ASIDE):
        assert start_decision(folder, mode) == expected
    else:
        with pytest.raises(UserError) as error:
            start_decision(folder, mode)
        assert expected in error.value.lines[-1]


@pytest.mark.parametrize("mode", [False, True, "auto"])
@pytest.mark.parametrize("kind", [Kind.FRESH, Kind.UNSAVED])
def test_an_attempt_stopped_by_bad_input_is_moved_aside_in_every_mode(kind, mode):
    folder = folder_of(kind, stopped_by_error=True, started=True)
    assert start_decision(folder, mode) == MOVE_ASIDE


def test_a_fresh_folder_where_a_job_started_needs_a_resume_mode():
    folder = folder_of(Kind.FRESH, started=True)  # an empty metrics.jsonl: refused as before
    with pytest.raises(UserError):
        start_decision(folder, False)
    assert start_decision(folder, "auto") == START


def test_move_aside_keeps_everything_but_the_lock(tmp_path):
    out = tmp_path / "run"
    (out / "hf_format" / "samples_8").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / ".lock").write_text("pid 1\n")
    aside = move_aside(out)
    assert re.fullmatch(r"run\.unsaved-\d{8}T\d{6}Z", aside.name), aside.name
    assert aside.parent == tmp_path
    assert sorted(p.name for p in out.iterdir()) == [".lock"]
    assert (aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (aside / "hf_format" / "samples_8").is_dir()
    assert move_aside(out) != aside  # a second one in the same second gets its own name


def test_choose_state_moves_an_unsaved_attempt_aside_under_auto_only(tmp_path, caplog):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UserError):
        choose_state(tmp_path / "run", None, True)
    with caplog.at_level("WARNING", logger="mini_trainer"):
        assert choose_state(tmp_path / "run", None, "auto") is None
    (aside,) = tmp_path.glob("run.unsaved-*")
    assert (aside / "metrics.jsonl").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    (line,) = caplog.messages
    assert line == (f"no saved state in {tmp_path / 'run'}: the earlier attempt is kept in "
                    f"{aside}, training starts over")  # fmt: skip


def test_a_recorded_bad_input_stop_is_moved_aside_without_a_resume_flag(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / STOPPED_BY_ERROR).write_text("{}")
    assert choose_state(out, None, False) is None
    assert (next(tmp_path.glob("run.unsaved-*")) / STOPPED_BY_ERROR).exists()


# ---------------------------------------------------------------- engine and pipeline agree


def test_all_states_damaged_is_refused_alike_by_the_engine_and_the_pipelines_command(
    demo_dir, tmp_path, capsys
):
    from mini_trainer.train import main

    out = tmp_path / "run"
    for step in (2, 4):
        (save_state(out, step) / "rng_rank1.pt").write_bytes(b"torn")
    flags = [str(flag) for flag in base_flags(demo_dir, out)]
    assert main([*flags, "--resume"]) == 2
    engine = capsys.readouterr().err.splitlines()
    pipeline = run_cli("launch", "--nproc-per-node", 1, "--", *flags, "--resume", "auto")
    assert pipeline.returncode == 2
    errors = [line for line in pipeline.stderr.splitlines() if line.startswith("error")]
    torn = "damaged: rng_rank1.pt does not load (UnpicklingError)"
    assert (
        engine
        == errors
        == [
            f"error: {out / 'state' / 'step_4'}: {torn}",
            f"error: {out / 'state' / 'step_2'}: {torn}",
            f"error: {out}: --resume: no intact state to continue from; use a new --output-dir",
        ]
    )
    assert sorted(p.name for p in (out / "state").iterdir()) == ["step_2", "step_4"]


def test_the_pipelines_train_rule_is_one_command_with_resume_auto():
    rule = (REPO_ROOT / "workflow" / "rules" / "train.smk").read_text()
    shell = rule[rule.index("    shell:") :]
    command = "".join(re.findall(r'^\s*"(.*)"\s*$', shell, flags=re.M))
    assert command.rstrip().endswith("--resume auto > {log} 2>&1"), command
    # the launcher replaces the shell: Slurm's stop signal must not kill a shell around it
    assert " exec {params.launcher}" in command, command
    for shell_logic in ("if ", "mv ", "ls ", "[ ", ";"):
        assert shell_logic not in command, command


# ---------------------------------------------------------------- flags, policy, trainer state


@pytest.mark.parametrize(("argv", "value"), [([], False), (["--resume"], True),
                                             (["--resume", "auto"], "auto")])  # fmt: skip
def test_resume_modes_parse_and_round_trip(argv, value):
    base = ["--model-name-or-path", "m", "--data-path", "d", "--output-dir", "o"]
    args = parse_training_args([*base, *argv])
    assert args.resume == value
    assert parse_training_args(to_cli_args(args)) == args
    assert TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o", resume=value)


def test_an_unknown_resume_mode_is_one_line():
    with pytest.raises(UserError) as error:
        TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o", resume="always")
    assert error.value.lines == ["--resume: unknown value 'always' (give no value, or auto)"]


def policy_args(**overrides):
    base = {"save_every_steps": None, "min_samples_per_checkpoint": None,
            "checkpoint_at_epoch": False}  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def due(args, step=1, seen=16, last=0, ends_epoch=False, stop=False):
    return checkpoints_due(args, step=step, samples_seen=seen, samples_at_last_checkpoint=last,
                           ends_epoch=ends_epoch, stop_requested=stop)  # fmt: skip


def test_checkpoint_policy():
    assert due(policy_args()) == Due()
    every_2 = policy_args(save_every_steps=2)
    assert [due(every_2, step=s).state for s in (1, 2, 3, 4)] == [False, True, False, True]
    assert due(policy_args(), stop=True) == Due(state=True)
    by_samples = policy_args(min_samples_per_checkpoint=32)
    assert due(by_samples, seen=16, last=0) == Due()
    assert due(by_samples, seen=48, last=16) == Due(exports=("hf_format/samples_48",))
    at_epoch = policy_args(checkpoint_at_epoch=True, min_samples_per_checkpoint=16)
    assert due(at_epoch, seen=64, last=48, ends_epoch=True).exports == ("hf_format/samples_64",)
    assert due(policy_args(checkpoint_at_epoch=True), ends_epoch=False) == Due()


def test_trainer_state_round_trips_and_reads_old_and_torn_files():
    state = TrainerState(Progress(3, 48, 900, 32), {"epoch": 0}, {"last_epoch": 3}, {"x": 1})
    assert TrainerState.from_json(state.to_json()) == state
    assert json.loads(state.to_json())["version"] == 2 and state.has_checksums
    old = TrainerState.from_json('{"progress": {"step": 4}, "sampler": {}, "scheduler": {}}')
    assert old.progress.step == 4 and old.version == 1 and not old.has_checksums
    for torn in ("", '{"progress": {"step": 4', '{"sampler": {}}', '{"progress": {"nope": 1}}'):
        with pytest.raises(TornTrainerState):
            TrainerState.from_json(torn)


# ---------------------------------------------------------------- end to end


def _break_sample(data, index_file, sample):
    """Rewrite one sample's line with one token fewer, same byte size: the index no longer
    matches it (what an edit after `validate` looks like to the reader). Returns the undo."""
    import pandas as pd

    row = pd.read_parquet(index_file).iloc[sample]
    original = data.read_bytes()
    start, size = int(row["offset"]), int(row["nbytes"])
    line = json.loads(original[start : start + size])
    line = {**line, "input_ids": line["input_ids"][:-1], "labels": line["labels"][:-1]}
    line.pop("len", None)
    text = json.dumps(line, separators=(",", ":")).encode()
    assert len(text) <= size
    data.write_bytes(original[:start] + text.ljust(size) + original[start + size :])
    return int(row["line"]), lambda: data.write_bytes(original)


@pytest.mark.slow
def test_a_run_stopped_by_a_data_error_reruns_with_the_same_command_once_fixed(demo_dir, tmp_path):
    import pandas as pd
    from helpers import read_metrics, train_in_process

    from mini_trainer.batching.sampler import BatchSampler

    data = tmp_path / "data.jsonl"
    # Big enough that a line in the middle lies outside the first and last MiB, which the
    # index's stale-file check hashes (an edit there is what only the reader can catch).
    data.write_bytes((demo_dir / "data" / "sort_plus1.train.jsonl").read_bytes() * 8)
    index = tmp_path / "index.parquet"
    summary = tmp_path / "summary.json"
    run_cli("validate", data, "--model", demo_dir / "model", "--max-tokens-per-gpu", 512,
            "--out-index", index, "--out-summary", summary, check=True)  # fmt: skip
    out = tmp_path / "run"
    flags = [*base_flags(demo_dir, out, **{"data-path": data, "data-index": index,
             "training-mode": "step", "max-steps": 4, "save-every-steps": 4})]  # fmt: skip
    rows = pd.read_parquet(index)
    sampler = BatchSampler(len(rows), 16, 7)  # --batch-size 16 --seed 7
    seen = [set(sampler.next_batch().indices.tolist()) for _ in range(3)]
    offsets = rows["offset"].to_numpy()
    middle = {int(i) for i, offset in enumerate(offsets)
              if 2**20 < offset < data.stat().st_size - 2**20 - 4096}  # fmt: skip
    sample = min((seen[2] - seen[0] - seen[1]) & middle)  # first read by step 3
    line, undo = _break_sample(data, index, sample)

    def run():  # `python -m mini_trainer.train FLAGS`, a world of one, in this process
        return train_in_process(*flags)

    failed = run()
    assert failed.returncode == 2, failed.stderr
    errors = [text for text in failed.stderr.splitlines() if text.startswith("error")]
    assert errors == [f"error: {data}:{line}: the data no longer matches its index (the file "
                      "changed after validation); rerun `mini-trainer validate`"]  # fmt: skip
    assert [row["step"] for row in read_metrics(out)] == [1, 2]
    assert not list((out / "state").glob("step_*"))
    undo()
    again = run()  # the same command, no --resume
    assert again.returncode == 0, again.stderr
    (aside,) = tmp_path.glob("run.unsaved-*")
    assert [row["step"] for row in read_metrics(aside)] == [1, 2]  # the attempt, kept
    assert json.loads((aside / STOPPED_BY_ERROR).read_text())["lines"] == [errors[0][7:]]
    assert [row["step"] for row in read_metrics(out)] == [1, 2, 3, 4]
    assert not (out / STOPPED_BY_ERROR).exists()
    said = f"no saved state in {out}: the earlier attempt is kept in {aside}, training starts over"
    assert said in again.stderr

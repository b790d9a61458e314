"""`mini-trainer train --nproc-per-node N` (and `launch`, which runs it): one line per error,
documented exit statuses, signals forwarded to every worker, one job per output folder, and a
stop at the first non-finite step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import (
    REPO_ROOT,
    base_flags,
    launcher_command,
    read_metrics,
    run_launcher,
    subprocess_env,
    train_in_process,
)

from mini_trainer.distributed.launcher import exit_status
from mini_trainer.errors import UserError
from mini_trainer.launch_args import TorchrunArgs, split_launcher_args


def test_launcher_flags_are_split_from_the_worker_flags():
    assert split_launcher_args(["--data-path", "d"]) == (None, ["--data-path", "d"])
    torchrun, rest = split_launcher_args(["--nproc-per-node=2", "--seed", "3", "--nnodes", "1"])
    assert torchrun == TorchrunArgs(nproc_per_node=2, nnodes=1) and rest == ["--seed", "3"]
    with pytest.raises(UserError, match="--nproc-per-node: expected an integer"):
        split_launcher_args(["--nproc-per-node", "two"])


def test_rendezvous_conf_and_local_address_reach_torchrun():
    """`--rdzv-conf` and `--local-addr` (a host whose name does not resolve to its address, as
    in tests/test_two_hosts.py) pass through to torchrun's own argument parser."""
    from torch.distributed.run import parse_args

    argv = ["--nnodes", "2", "--nproc-per-node=1", "--rdzv-endpoint", "10.0.0.1:29555",
            "--rdzv-conf", "is_host=false,read_timeout=30", "--local-addr=10.0.0.2",
            "--seed", "3"]  # fmt: skip
    torchrun, rest = split_launcher_args(argv)
    assert rest == ["--seed", "3"]
    assert torchrun == TorchrunArgs(
        nproc_per_node=1, nnodes=2, rdzv_endpoint="10.0.0.1:29555",
        rdzv_conf="is_host=false,read_timeout=30", local_addr="10.0.0.2",
    )  # fmt: skip
    assert split_launcher_args(torchrun.launcher_cli_args()) == (torchrun, [])
    parsed = parse_args([*torchrun.to_cli_args(), "-m", "mini_trainer.train"])
    assert (parsed.rdzv_conf, parsed.local_addr) == ("is_host=false,read_timeout=30", "10.0.0.2")
    assert (parsed.rdzv_endpoint, parsed.nnodes) == ("10.0.0.1:29555", "2")
    alone = parse_args([*TorchrunArgs(nproc_per_node=2).to_cli_args(), "-m", "x"])
    assert alone.local_addr is None and alone.rdzv_conf == ""


def report(rank, code, when, lines=(), traceback=None):
    out = {"rank": rank, "exit": code, "lines": list(lines), "time": when}
    if traceback:
        out["traceback"] = traceback
    return out


def test_exit_status_prefers_the_user_error_to_the_crashes_it_causes():
    crash = report(0, 1, 2.0, traceback="Traceback ...\nRuntimeError: peer closed")
    user = report(1, 2, 1.0, ["data.jsonl:7: the data no longer matches its index"])
    assert exit_status([user, crash], {0: 1, 1: 2}) == (
        2, ["error: data.jsonl:7: the data no longer matches its index"]
    )  # fmt: skip
    same = [report(0, 2, 1.0, ["x: bad"]), report(1, 2, 1.1, ["x: bad"])]
    assert exit_status(same, {0: 2, 1: 2}) == (2, ["error: x: bad"])
    assert exit_status([report(0, 75, 1.0), report(1, 75, 1.0)], {}) == (75, [])
    status, lines = exit_status([crash], {0: 1})
    assert status == 1 and lines[0] == "error: rank 0 crashed:" and "peer closed" in lines[1]
    assert exit_status([], {1: -9}) == (1, ["error: rank 1 was killed by SIGKILL (out of memory?)"])
    assert exit_status([], {}) == (0, [])


def test_a_lost_peer_is_one_line_unless_a_rank_tells_more():
    """A rank that failed only because another died (another host's processes killed) says so
    in one line; the dead rank's own story, where this launcher has it, wins."""
    lost = {**report(0, 1, 2.0, ["lost contact with another process of this job (x)"]),
            "lost_peer": True}  # fmt: skip
    assert exit_status([lost], {0: 1}) == (
        1, ["error: lost contact with another process of this job (x)"]
    )  # fmt: skip
    killed = exit_status([lost], {0: 1, 1: -9})
    assert killed == (1, ["error: rank 1 was killed by SIGKILL (out of memory?)"])
    user = report(1, 2, 1.0, ["data.jsonl:7: bad"])
    assert exit_status([lost, user], {0: 1, 1: 2}) == (2, ["error: data.jsonl:7: bad"])
    crash = report(1, 1, 3.0, traceback="Traceback ...\nValueError: x")
    assert exit_status([lost, crash], {0: 1, 1: 1})[1][0] == "error: rank 1 crashed:"
    assert exit_status([lost, report(1, 75, 1.0)], {0: 1})[0] == 75


def test_lost_peer_recognises_a_closed_connection_through_causes():
    from mini_trainer.distributed.lifetime import lost_peer

    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer "
        "[10.231.0.2]:40123"
    )
    try:
        try:
            raise gloo
        except RuntimeError as error:
            raise RuntimeError("writing state/step_4 failed") from error
    except RuntimeError as wrapped:
        line = lost_peer(wrapped)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "lost contact with another process of this job (Connection closed by peer "
        "[10.231.0.2]:40123)"
    )
    assert "--resume" in line
    assert lost_peer(RuntimeError("CUDA out of memory")) is None
    assert lost_peer(ValueError("bad value")) is None


def test_a_lost_rendezvous_host_is_one_line_naming_it():
    """Host A (serving the rendezvous store) killed: torchrun's agent on host B raises a
    RendezvousConnectionError; the launcher says so in one line (no traceback)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from mini_trainer.distributed.lifetime import lost_rendezvous

    try:
        try:
            raise RuntimeError("Connection reset by peer\nException raised from recvBytes")
        except RuntimeError as error:
            raise RendezvousConnectionError("The connection to the C10d store has failed.") from (
                error
            )
    except RendezvousConnectionError as wrapped:
        line = lost_rendezvous(wrapped, "10.231.0.1:29555")
    assert "\n" not in line
    assert line.startswith(
        "lost contact with the rendezvous host 10.231.0.1:29555 (Connection reset by peer)"
    )
    assert "--resume on every host" in line
    bare = lost_rendezvous(RendezvousConnectionError("store gone"), "h:1")
    assert "(store gone)" in bare


STORE_GOES_AWAY = """
import os, sys
from datetime import timedelta
if sys.argv[1] == "quiet":
    from mini_trainer.distributed.launcher import import_torch_quietly
    import_torch_quietly()
print("workers get:", os.environ.get("TORCH_CPP_LOG_LEVEL"))
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
client.set("seen", "1")
del server  # as when the host serving the rendezvous store dies
try:
    client.get("next")
except Exception as error:
    print("raised", type(error).__name__)
"""


@pytest.mark.parametrize("mode", ["loud", "quiet"])
def test_the_launcher_keeps_c10d_store_warnings_out_of_its_output(mode):
    """A store client whose server is gone, as host B's agent when host A dies: c10 logs each
    failed socket call as a warning with a C++ stack (the `loud` control: plain torch), unless
    torch was imported through `import_torch_quietly` (the launcher's way), which leaves
    TORCH_CPP_LOG_LEVEL unset for the workers it starts."""
    result = subprocess.run(
        [sys.executable, "-c", STORE_GOES_AWAY, mode],
        capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO_ROOT,
    )  # fmt: skip
    assert "raised DistNetworkError" in result.stdout, result.stdout + result.stderr
    assert "workers get: None" in result.stdout
    noisy = "TCPStore.cpp" in result.stderr and "frame #0" in result.stderr
    assert noisy == (mode == "loud"), result.stderr[-2000:]


OUT_OF_VOCAB = 99999


def _big_data_with_a_changed_sample_on_rank_1(demo_dir, tmp_path, out_of_vocab=False):
    """A >2 MiB data file and its index, then one sample that rank 1 reads in step 1 rewritten
    (same bytes, one token fewer) in the middle of the file, where the index's staleness check
    (size, first and last MiB) does not look: only rank 1 finds out, when it reads the sample."""
    from mini_trainer.batching.collator import plan_step
    from mini_trainer.batching.sampler import BatchSampler
    from mini_trainer.data.index_file import write_index
    from mini_trainer.data.validate import build_index, read_vocab_size

    lines = (demo_dir / "data" / "sort.train.jsonl").read_bytes().splitlines(keepends=True)
    data = tmp_path / "big.jsonl"
    data.write_bytes(b"".join(lines * 6))
    index_path = tmp_path / "big.parquet"
    index, summary = build_index(data, read_vocab_size(demo_dir / "model"), 512)
    write_index(index, summary, index_path, tmp_path / "big.json")
    lengths, loss_tokens = index["len"].to_numpy(), index["loss_tokens"].to_numpy()
    batch = BatchSampler(len(index), 16, 7).next_batch()
    plan = plan_step(batch.indices, lengths, loss_tokens, 2, 512)
    rank1 = [i for ranks in plan.micro_batches for i in ranks[1]]
    size = data.stat().st_size
    victim = next(i for i in rank1 if 1 << 20 < index["offset"][i] < size - (2 << 20))
    raw = bytearray(data.read_bytes())
    start, nbytes = int(index["offset"][victim]), int(index["nbytes"][victim])
    sample = json.loads(raw[start : start + nbytes])
    if out_of_vocab:  # a token id the model does not have, at the same length
        sample["input_ids"][1] = OUT_OF_VOCAB
        edited = {"input_ids": sample["input_ids"], "labels": sample["labels"]}
    else:
        edited = {"input_ids": sample["input_ids"][:-1], "labels": sample["labels"][:-1]}
    shorter = json.dumps(edited, separators=(",", ":")).encode()
    assert len(shorter) <= nbytes
    raw[start : start + nbytes] = shorter.ljust(nbytes)  # JSON allows trailing spaces
    data.write_bytes(bytes(raw))
    return data, index_path, int(index["line"][victim])


@pytest.mark.slow
def test_a_user_error_on_rank_1_is_printed_once_with_its_status(demo_dir, tmp_path):
    """Through `mini-trainer launch` (the pipeline's way in); `train --nproc-per-node` runs the
    same `train.launch` (tests/test_imports.py::test_one_launch_path)."""
    data, index, line = _big_data_with_a_changed_sample_on_rank_1(demo_dir, tmp_path)
    flags = {"data-path": data, "data-index": index, "training-mode": "step", "max-steps": 2}
    env = subprocess_env()
    env.pop("OMP_NUM_THREADS")  # as a user's shell: the launcher sets 1 for the workers
    result = run_launcher(*base_flags(demo_dir, tmp_path / "run", **flags), via="launch", env=env)
    assert result.returncode == 2, result.stderr
    # Besides the workers' `[rankN]` log lines and launch's own command line, only the error:
    # no banner from torchrun (OMP_NUM_THREADS), no warning about the flags launch built.
    lines = [text for text in result.stderr.splitlines() if not text.startswith("[rank")]
    assert lines[0].startswith("mini-trainer launch (standalone): ")
    assert lines[1:] == [
        f"error: {data}:{line}: the data no longer matches its index (the file changed after "
        "validation); rerun `mini-trainer validate`"
    ], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_token_id_edited_after_validation_stops_with_file_and_line(demo_dir, tmp_path):
    """Not an IndexError in the embedding mid-run: the line is checked when it is read."""
    from mini_trainer.data.validate import read_vocab_size

    data, index, line = _big_data_with_a_changed_sample_on_rank_1(demo_dir, tmp_path, True)
    flags = {"data-path": data, "data-index": index, "training-mode": "step", "max-steps": 2}
    result = run_launcher(*base_flags(demo_dir, tmp_path / "run", **flags))
    assert result.returncode == 2, result.stderr
    top = read_vocab_size(demo_dir / "model") - 1
    assert "Traceback" not in result.stderr and "IndexError" not in result.stderr
    assert [text for text in result.stderr.splitlines() if "error" in text.lower()] == [
        f"error: {data}:{line}: input_ids: token id {OUT_OF_VOCAB} is outside the vocabulary "
        f"(0..{top}) (the file changed after validation); rerun `mini-trainer validate`"
    ], result.stderr


@pytest.mark.slow
def test_a_bad_flag_is_refused_before_any_worker_starts(demo_dir, tmp_path):
    result = run_launcher(*base_flags(demo_dir, tmp_path / "run", **{"learning-rate": "-1e-3"}))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --learning-rate: must be a finite number >= 0, "
                                          "got -0.001"]  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_folder_in_use_is_refused_by_the_launcher_before_any_worker_starts(demo_dir, tmp_path):
    """This process holds the folder's lock as a running job's rank 0 would: `launch` raises
    the lock's one line itself (without the check it would start two workers, which would
    then find the lock taken and return 2)."""
    from mini_trainer.distributed import run_lock
    from mini_trainer.train import launch

    out = tmp_path / "run"
    assert run_lock.try_lock(out) is None
    try:
        with pytest.raises(UserError, match=r"--output-dir is in use by another training job"):
            launch(TorchrunArgs(nproc_per_node=2), base_flags(demo_dir, out))
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        run_lock.release()
    assert not out.exists()  # the lock made the folder and nothing else was written: removed


def _start_infinite_run(demo_dir, out, **env):
    process = subprocess.Popen(
        launcher_command(*base_flags(demo_dir, out, **{"training-mode": "infinite"})),
        env=subprocess_env(**env), cwd=REPO_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return process


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGUSR1", "pipeline killed"])  # SIGTERM/SIGINT: test_train
def test_stop_signals_reach_every_worker_and_nothing_is_orphaned(demo_dir, tmp_path, stop):
    """SIGUSR1 (which kills plain torchrun) reaches every worker; and the job stops the same
    way when the Snakemake that started it is killed (here a `sleep` stands for it, named as
    the pipeline's train rule names its Snakemake), so a rerun finds the folder free."""
    from mini_trainer.distributed.run_lock import in_use
    from mini_trainer.training.run_folder import classify

    out = tmp_path / "run"
    pipeline = subprocess.Popen(["sleep", "600"])
    process = _start_infinite_run(demo_dir, out, MINI_TRAINER_STOP_WITH_PID=str(pipeline.pid))
    workers = psutil.Process(process.pid).children(recursive=True)
    assert len(workers) >= 2
    if stop == "SIGUSR1":
        # A second job on the same folder, even a --resume, is refused at once (a world of one,
        # in this process).
        second = train_in_process(
            *base_flags(demo_dir, out, **{"training-mode": "infinite", "resume": True})
        )
        assert second.returncode == 2, second.stderr
        (line,) = [text for text in second.stderr.splitlines() if text.startswith("error")]
        assert "--output-dir is in use by another training job (pid" in line
        process.send_signal(signal.SIGUSR1)
    else:
        pipeline.kill()
    _, stderr = process.communicate(timeout=300)
    pipeline.kill()
    pipeline.wait()
    assert process.returncode == 75, stderr
    assert "Traceback" not in stderr
    signame = "SIGUSR1" if stop == "SIGUSR1" else "SIGTERM"
    assert f"stopped by {signame}" in stderr
    if stop != "SIGUSR1":
        assert f"the process {pipeline.pid} that started this job" in stderr, stderr
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"orphaned workers: {alive}"
    assert in_use(out) is None
    # The newest intact state (checksums verified): what a SIGTERM to plain torchrun's agent
    # (the same agent, run in the launcher) gave test_train's former torchrun test.
    assert classify(out).state == out / "state" / max(
        (p.name for p in (out / "state").iterdir()), key=lambda n: int(n.split("_")[1])
    )
    (state,) = (out / "state").iterdir()
    assert sorted(p.name for p in state.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    assert read_metrics(out)[-1]["step"] == int(state.name.removeprefix("step_"))


@pytest.mark.slow
def test_workers_stop_when_the_launcher_is_killed_and_the_run_resumes(demo_dir, tmp_path):
    """SIGKILL reaches the launcher alone (nothing forwards it): the kernel's parent-death
    signal stops the workers, which save a state as on SIGTERM; the same run then resumes."""
    out = tmp_path / "run"
    flags = {"training-mode": "step", "max-steps": 20, "save-every-steps": 2}
    process = subprocess.Popen(
        launcher_command(*base_flags(demo_dir, out, **flags)), env=subprocess_env(),
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (out / "state" / "step_2").exists():
        assert process.poll() is None, "the run ended before its first state"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = psutil.Process(process.pid).children(recursive=True)
    assert len(workers) >= 2
    process.kill()
    process.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)  # seconds in practice; generous margin
    assert not alive, f"workers outlived their launcher: {alive}"
    # Orphaned workers (as before the parent-death signal) would have trained to the end.
    assert not (out / "state" / "step_20").exists(), "the workers finished without a launcher"
    newest = max(int(p.name.removeprefix("step_")) for p in (out / "state").glob("step_*"))
    resumed = train_in_process(*base_flags(demo_dir, out, **flags, resume=True))  # one rank
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {out / 'state' / f'step_{newest}'}" in resumed.stderr
    assert [row["step"] for row in read_metrics(out)] == list(range(1, 21))


@pytest.mark.slow
def test_a_non_finite_loss_stops_at_its_step_and_exports_nothing(demo_dir, tmp_path):
    out = tmp_path / "run"
    flags = {"learning-rate": 1e30, "training-mode": "step", "max-steps": 6,
             "save-every-steps": 1, "save-final-checkpoint": True}  # fmt: skip
    result = run_launcher(*base_flags(demo_dir, out, **flags), nproc=1)
    assert result.returncode == 3, result.stderr
    (line,) = [text for text in result.stderr.splitlines() if text.startswith("error")]
    rows = read_metrics(out)
    bad_step = len(rows) + 1
    assert line.startswith(f"error: step {bad_step}: non-finite loss"), line
    assert f"last saved state: {out / 'state' / f'step_{len(rows)}'}" in line
    assert "Traceback" not in result.stderr
    assert not (out / "final").exists() and not (out / "hf_format").exists()
    states = sorted(int(p.name.removeprefix("step_")) for p in (out / "state").glob("step_*"))
    assert states and max(states) == len(rows), "no state is saved for the bad step"
    # The newest state holds the last good (finite) weights.
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(out / "state" / f"step_{max(states)}", tmp_path / "state.pt")
    weights = torch.load(tmp_path / "state.pt", weights_only=False)["model"]
    assert weights and all(bool(torch.isfinite(t).all()) for t in weights.values())

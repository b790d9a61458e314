"""Helpers shared by the tests: child-process environment, CLI, Python and training runners,
flags, metrics, killing a training job mid-run, the tiny random Llama the unit tests build, the
whole-model layer-importance reference, and copies of the workflow for pipeline runs.
Fixtures live in conftest.py; tests import these from here (`from helpers import ...`), never
from conftest."""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORLD_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
"""What torchrun (or a world-of-one process group) sets: a new job picks its own."""
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles")
"""What a copy of the pipeline needs (`make_workdir`)."""
WHOLE_SUITE_COUNT = pytest.StashKey["int | None"]()
"""The whole suite's test count when this session collected it all (conftest.py), else None."""
DESELECTED = pytest.StashKey[int]()
"""How many collected tests -m/-k deselected (conftest.py)."""


TINY_LLAMA = dict(
    vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, use_cache=False,
)  # fmt: skip
"""The tiny Llama's sizes; a test passes others where it needs them."""


def tiny_llama(attention: str | None = None, seed: int | None = 0, **config):
    """A random `LlamaForCausalLM` of `TINY_LLAMA`'s sizes (`config` overrides them), after
    `torch.manual_seed(seed)` (none when `seed` is None), with `attention` as its attention
    implementation when given (a registered name too)."""
    # deferred: torch, transformers (most tests that use these helpers need neither)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    llama_config = LlamaConfig(**{**TINY_LLAMA, **config})
    if attention is not None:
        llama_config._attn_implementation = attention
    return LlamaForCausalLM(llama_config)


def whole_model_importance(model_dir, samples: list[list[int]]) -> list[float]:
    """Adaptive OSFT's layer importance the way it was measured before the streamed measure
    (issue 19.6): the whole fp32 model, one sample at a time, forward hooks. The reference of
    tests/test_osft_adaptive.py and of benchmarks/load_export.py's "legacy" side."""
    # deferred: torch, transformers (most tests that use these helpers need neither)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    layers = list(model.get_decoder().layers)
    sums = torch.zeros(len(layers), dtype=torch.float64)
    hooks = []

    def record(index):
        def hook(module, args, kwargs, output):
            hidden_in = args[0] if args else kwargs["hidden_states"]
            hidden_out = output[0] if isinstance(output, tuple) else output
            cosine = torch.nn.functional.cosine_similarity(
                hidden_in.float(), hidden_out.float(), dim=-1
            )
            sums[index] += cosine.double().sum()

        return hook

    for index, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(record(index), with_kwargs=True))
    model.eval()
    with torch.no_grad():
        for ids in samples:
            model(input_ids=torch.tensor([ids]), use_cache=False)
    for hook in hooks:
        hook.remove()
    return (sums / sum(len(ids) for ids in samples)).tolist()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout importable, no network, quiet threads."""
    env = dict(os.environ)
    # In-process runs (a world of one) set these in the test process; a child must pick its own.
    for name in WORLD_VARIABLES:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.update(extra)
    return env


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh process of this checkout (what a light path imports shows
    only there): output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
        cwd=REPO_ROOT, timeout=timeout,
    )  # fmt: skip


def run_cli(
    *args: str | os.PathLike, check: bool = False, in_process: bool = True, **kwargs
) -> subprocess.CompletedProcess:
    """Run `mini-trainer ARGS...`; return the completed process with text stdout/stderr.

    In-process through click's CliRunner by default (no interpreter and torch start-up per
    call: most of a CLI test's time); `in_process=False` (or any subprocess keyword) runs
    `python -m mini_trainer` in a child process instead. An unexpected exception shows as a
    traceback on stderr and exit status 1, as it would in a child.
    """
    argv = [str(arg) for arg in args]
    if in_process and not kwargs:
        import traceback

        from click.testing import CliRunner

        from mini_trainer.cli import cli

        offline = {key: value for key, value in subprocess_env().items()
                   if key in ("HF_HUB_OFFLINE", "WANDB_MODE")}  # fmt: skip
        with _logging_as_in_a_fresh_process():
            result = CliRunner(env=offline).invoke(cli, argv, prog_name="mini-trainer")
        stderr = result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            stderr += "".join(traceback.format_exception(result.exception))
        completed = subprocess.CompletedProcess(argv, result.exit_code, result.stdout, stderr)
    else:
        completed = subprocess.run(
            [sys.executable, "-m", "mini_trainer", *argv],
            capture_output=True,
            text=True,
            env=kwargs.pop("env", None) or subprocess_env(),
            cwd=kwargs.pop("cwd", REPO_ROOT),
            timeout=kwargs.pop("timeout", 600),
            **kwargs,
        )
    if check and completed.returncode != 0:
        raise AssertionError(f"mini-trainer {argv} failed:\n{completed.stdout}\n{completed.stderr}")
    assert_each_line_once(completed)
    return completed


LOG_PREFIX = re.compile(r"^\[rank\d+\] \d\d:\d\d:\d\d ")
"""What `mini_trainer.log_setup` puts before a job's log line."""


def assert_each_line_once(completed: subprocess.CompletedProcess) -> None:
    """Every command prints each line once: no line of stdout and stderr together repeats (a
    result echoed by the command and also logged by the library below it, a message printed by
    every rank), the log prefix (`[rank0] 12:00:00 `) aside; indented lines (a help page's
    columns, printed JSON) are layout, not messages. Checked on every `run_cli` call."""
    text = completed.stdout + completed.stderr
    lines = [LOG_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    # Messages start at the margin; indented lines are layout (--help's columns, JSON).
    messages = [line for line in lines if line[:1].strip() and re.search(r"\w", line)]
    counts = collections.Counter(messages)
    repeated = [line for line, count in counts.items() if count > 1]
    if repeated:
        raise AssertionError(
            f"mini-trainer {completed.args} printed a line more than once: {repeated[0]!r}\n"
            f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
        )


@contextlib.contextmanager
def _logging_as_in_a_fresh_process():
    """The root logger as a new process has it (no handler, WARNING) while a command runs
    in-process, so its `setup_logging()` installs its handler on the runner's stderr as it
    would on a child's: its log lines are in the result, as a child's are. Put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def torchrun_command(*train_flags, nproc: int = 2) -> list[str]:
    """`torchrun --nproc-per-node N -m mini_trainer.train FLAGS` as an argv list."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "mini_trainer.train", *map(str, train_flags),
    ]  # fmt: skip


def launcher_command(*train_flags, nproc: int = 2, via: str = "train") -> list[str]:
    """`mini-trainer train --nproc-per-node N FLAGS` (the launcher) as an argv list; with
    `via="launch"`, `mini-trainer launch --nproc-per-node N -- FLAGS` (the pipeline's way in,
    which runs the same launcher)."""
    head = [sys.executable, "-m", "mini_trainer", via, "--nproc-per-node", str(nproc)]
    return [*head, *(["--"] if via == "launch" else []), *map(str, train_flags)]


def run_launcher(
    *train_flags, nproc: int = 2, timeout: int = 600, via: str = "train", env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a training job through the launcher; return it whatever its exit status. `env`:
    the whole environment (default `subprocess_env()`)."""
    return subprocess.run(
        launcher_command(*train_flags, nproc=nproc, via=via),
        capture_output=True,
        text=True,
        env=subprocess_env() if env is None else env,
        cwd=REPO_ROOT,
        timeout=timeout,
    )


def run_torchrun(
    *train_flags, nproc: int = 2, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a training job under real torchrun (gloo on CPU); fail the test if it fails."""
    result = subprocess.run(
        torchrun_command(*train_flags, nproc=nproc),
        capture_output=True,
        text=True,
        env=subprocess_env(**(env or {})),
        cwd=REPO_ROOT,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def train_in_process(*train_flags) -> subprocess.CompletedProcess:
    """Run a world-of-one training job in this test process: `mini_trainer.train.main(FLAGS)`,
    as a plain `python -m mini_trainer.train` would, without the interpreter and torch start-up
    a child pays (most of a one-step run's cost). Returns its exit status and what it printed,
    its log lines (rank 0's, from INFO) on stderr as a child has them; an unexpected exception
    propagates, as it would end a child with a traceback.

    The job leaves nothing behind in this process: the variables its process group sets, the
    signal handlers its preemption watch installs and the thread count are put back."""
    import io

    import torch

    from mini_trainer.distributed.launcher import REPORT_DIR_ENV
    from mini_trainer.distributed.preemption import STOP_SIGNALS
    from mini_trainer.train import main

    saved_env = dict(os.environ)
    saved_handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 gives a child (subprocess_env)
    try:
        for name in (*WORLD_VARIABLES, "TORCHELASTIC_RUN_ID", REPORT_DIR_ENV):
            os.environ.pop(name, None)
        os.environ.update(HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
        argv = [str(flag) for flag in train_flags]
        out, err = io.StringIO(), io.StringIO()
        logger = logging.getLogger("mini_trainer")
        log_lines, level = logging.StreamHandler(err), logger.level
        logger.addHandler(log_lines)
        logger.setLevel(logging.INFO)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main(argv)
        finally:
            logger.removeHandler(log_lines)
            logger.setLevel(level)
        return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())
    finally:
        torch.set_num_threads(threads)
        for signum, handler in saved_handlers.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(saved_env)


def base_flags(demo_dir, out, task="sort_plus1", **overrides):
    flags = {
        "model-name-or-path": demo_dir / "model",
        "data-path": demo_dir / "data" / f"{task}.train.jsonl",
        "output-dir": out,
        "batch-size": 16,
        "max-tokens-per-gpu": 512,
        "learning-rate": 3e-3,
        "save-dtype": "float32",
        "seed": 7,
    }
    flags.update(overrides)
    argv = []
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not None and value is not False:
            argv += [f"--{key}", str(value)]
    return argv


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def kill_tree(process: psutil.Process) -> None:
    """SIGKILL a process and every descendant (torchrun starts its workers in new sessions)."""
    victims = [process, *process.children(recursive=True)]
    for victim in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=60)


def kill_when_saved(
    argv: list[str], marker: Path, timeout: float = 300, ready=None, env: dict | None = None
) -> None:
    """Run training job ARGV until MARKER (a state folder) exists, then SIGKILL the job and all
    its processes, as an out-of-memory killer or a lost node would. Fails the test if the job
    ends first or MARKER does not appear within TIMEOUT seconds. `ready()`, when given, is
    waited for instead of MARKER (MARKER's run folder must still have no final/); `env`: extra
    variables for the job."""
    process = subprocess.Popen(
        argv, env=subprocess_env(**(env or {})), cwd=REPO_ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ready = ready or marker.exists
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert process.poll() is None, f"the run ended before saving {marker.name}"
            assert time.monotonic() < deadline, f"no {marker} after {timeout} s"
            time.sleep(0.02)
    finally:
        if process.poll() is None:
            kill_tree(psutil.Process(process.pid))
        process.wait()
    assert not (marker.parent.parent / "final").exists(), "the run finished before it was killed"


def make_workdir(path: Path, config: dict | None = None) -> Path:
    """A copy of the workflow in `path`; `config` replaces config/config.yaml when given."""
    path.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, path / name)
        else:
            shutil.copy2(source, path / name)
    if config is not None:
        write_config(path, config)
    return path


def write_config(workdir: Path, config: dict, name: str = "config/config.yaml") -> Path:
    """Write `config` as YAML to `name` inside the workflow copy `workdir`."""
    target = workdir / name
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target

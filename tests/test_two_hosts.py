"""Two hosts for real: two network namespaces joined by a veth pair, each with its own address,
one `mini-trainer train --nnodes 2` (one rank) in each, rendezvous and gloo traffic over those
addresses only. Both tests match the uninterrupted 2-rank single-host run that the Slurm tests
match too (`slurm_reference_run`, built once per session).

Root only (network namespaces), like the Slurm tests; slow (several real training jobs).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
import torch
from helpers import REPO_ROOT, subprocess_env
from safetensors.torch import load_file
from slurm.common import STEPS, metrics, train_flags

HOSTS = [("10.231.0.1", "A"), ("10.231.0.2", "B")]
"""(address, namespace and veth suffix) of each host; /24, nothing else routed."""
PORTS = itertools.count(29555)
"""One rendezvous port per job, so that no job meets a port its predecessor left behind."""
STOP_BOUND_S = 300
"""How long the surviving host may take to give up: well inside torchrun's rendezvous
timeouts (join 600 s) and the process group's (30 min); in practice seconds."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def two_hosts():
    """Two namespaces `mt-<id>-A/B` with `lo` up and a veth pair between them; removed after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (apt-get install iproute2)")
    tag = uuid.uuid4().hex[:6]
    names = [(f"mt-{tag}-{side}", f"v{tag}{side}", address) for address, side in HOSTS]
    created = []
    try:
        for namespace, _, _ in names:
            _ip("netns", "add", namespace)
            created.append(namespace)
        _ip("link", "add", names[0][1], "type", "veth", "peer", "name", names[1][1])
        for namespace, veth, address in names:
            _ip("link", "set", veth, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", veth)
            _ip("-n", namespace, "link", "set", veth, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as error:
        for namespace in created:
            subprocess.run(["ip", "netns", "del", namespace], check=False)
        pytest.skip(f"cannot create network namespaces here: {error.stderr.strip()}")
    yield names
    for namespace in created:  # deleting a namespace deletes its end of the veth pair too
        subprocess.run(["ip", "netns", "del", namespace], check=False)


def start_job(two_hosts, flags) -> list[subprocess.Popen]:
    """`mini-trainer train --nnodes 2` in each namespace: the c10d rendezvous on host A's
    address (A serves its store: `is_host`), each host's own address (`--local-addr`), gloo
    bound to the host's veth (GLOO_SOCKET_IFNAME)."""
    port = next(PORTS)
    processes = []
    for node_rank, (namespace, veth, address) in enumerate(two_hosts):
        launcher = [
            sys.executable, "-m", "mini_trainer", "train", "--nnodes", "2", "--nproc-per-node",
            "1", "--node-rank", str(node_rank), "--rdzv-id", f"two-hosts-{port}",
            "--rdzv-endpoint", f"{HOSTS[0][0]}:{port}",
            "--rdzv-conf", f"is_host={'true' if node_rank == 0 else 'false'}",
            "--local-addr", address, *flags,
        ]  # fmt: skip
        processes.append(
            subprocess.Popen(
                ["ip", "netns", "exec", namespace, *launcher],  # ip execs: same pid
                env=subprocess_env(GLOO_SOCKET_IFNAME=veth),
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return processes


def finish(processes: list[subprocess.Popen]) -> list[str]:
    """Each host's stderr, once both exited 0."""
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-4000:]
    return [stderr for _, stderr in outputs]


def assert_same_final_weights(out, reference) -> None:
    got = load_file(out / "final" / "model.safetensors")
    want = load_file(reference / "final" / "model.safetensors")
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7, msg=key)


def kill_host_after_first_state(out, doomed_host, survivor) -> float:
    """SIGKILL to `doomed_host`'s launcher and worker (a power cut) once the run's first state
    is saved; the time of the kill."""
    deadline = time.monotonic() + 600
    while not (out / "state" / "step_2").exists():
        assert doomed_host.poll() is None and survivor.poll() is None, "a host ended early"
        assert time.monotonic() < deadline, "no state after 10 minutes"
        time.sleep(0.02)
    doomed = [*psutil.Process(doomed_host.pid).children(recursive=True)]
    doomed.append(psutil.Process(doomed_host.pid))
    for process in doomed:  # the worker first: its parent's death would only send it SIGTERM
        process.send_signal(signal.SIGKILL)
    psutil.wait_procs(doomed, timeout=60)
    doomed_host.communicate(timeout=60)
    return time.monotonic()


def assert_one_line_stop(survivor, killed_at: float, reason: str) -> None:
    """The surviving host's job exits non-zero soon, with one line naming the loss and the
    resume, no traceback, no C++ stack: only its workers' `[rankN]` lines and c10d's warnings
    at the start ("[W... socket.cpp] [c10d] The hostname of the client socket cannot be
    retrieved": no reverse DNS in bare namespaces) besides."""
    _, stderr = survivor.communicate(timeout=STOP_BOUND_S)
    assert time.monotonic() - killed_at < STOP_BOUND_S
    assert survivor.returncode not in (0, 75), stderr
    for noise in ("Traceback", "terminate called", "frame #", "TCPStore.cpp"):
        assert noise not in stderr, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith(("[rank", "[W"))]
    assert len(lines) == 1 and lines[0].startswith(f"error: lost contact with {reason}"), stderr
    assert lines[0].endswith("--resume on every host to continue from the last saved state")


@pytest.mark.slow
def test_killing_one_host_stops_the_other_with_one_line_and_both_resume_exactly(
    two_hosts, slurm_reference_run, demo_dir, tmp_path
):
    """Host B dies outright: host A's job loses its peer and exits non-zero with one line, no
    traceback; the same command (it carries --resume) on both hosts then continues to the
    weights of one host with two ranks (so two hosts train as one host does: steps before the
    kill came from the first attempt, the rest from the resumed one; an uninterrupted two-host
    run of its own added nothing to that claim and cost 40 CPU-s)."""
    out = tmp_path / "run"
    flags = [*train_flags(demo_dir, out), "--save-every-steps", "2"]
    host_a, host_b = start_job(two_hosts, flags)
    killed_at = kill_host_after_first_state(out, host_b, host_a)
    assert_one_line_stop(host_a, killed_at, "another process of this job")
    assert not (out / "final").exists(), "the run finished before host B was killed"
    assert len(metrics(out)) < STEPS, "killed too late to test a resume"

    stderr = finish(start_job(two_hosts, flags))  # --resume is among the flags
    assert "resumed from" in stderr[0] + stderr[1]
    assert "2 ranks on cpu" in stderr[0] + stderr[1]
    assert [row["step"] for row in metrics(out)] == list(range(1, STEPS + 1))
    assert_same_final_weights(out, slurm_reference_run)


@pytest.mark.slow
def test_killing_the_rendezvous_host_stops_the_other_with_one_line(two_hosts, demo_dir, tmp_path):
    """Host A, which serves the rendezvous store, dies outright: host B's launcher loses the
    store (torchrun's RendezvousConnectionError, and c10d's C++ warnings with a stack for each
    failed socket call, kept out by `import_torch_quietly`) and exits with one line naming the
    host. Resuming after it is the same as after losing host B (the test above)."""
    out = tmp_path / "run"
    host_a, host_b = start_job(two_hosts, [*train_flags(demo_dir, out), "--save-every-steps", "2"])
    killed_at = kill_host_after_first_state(out, host_a, host_b)
    assert_one_line_stop(host_b, killed_at, f"the rendezvous host {HOSTS[0][0]}:")

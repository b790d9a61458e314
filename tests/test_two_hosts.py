"""Two hosts for real: two network namespaces joined by a veth pair, each with its own address,
one torchrun (one rank) in each, rendezvous and gloo traffic over those addresses only.

Root only (network namespaces), like the Slurm tests; slow (two real training processes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest
import torch
from conftest import REPO_ROOT, base_flags, subprocess_env
from safetensors.torch import load_file

HOSTS = [("10.231.0.1", "mtA"), ("10.231.0.2", "mtB")]
"""(address, veth and namespace suffix) of each host; /24, nothing else routed."""
PORT = 29555


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two namespaces `mt-<id>-A/B` with `lo` up and a veth pair between them; removed after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (apt-get install iproute2)")
    tag = uuid.uuid4().hex[:6]
    names = [(f"mt-{tag}-{side}", f"v{tag}{side}", address) for address, side in
             [(a, s[-1]) for a, s in HOSTS]]  # fmt: skip
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


def _host_command(namespace, veth, address, is_host, flags):
    """torchrun on one 'host': c10d rendezvous on the first host's address, gloo on the veth."""
    env = ["env", f"GLOO_SOCKET_IFNAME={veth}", f"PYTHONPATH={REPO_ROOT}"]
    return [
        "ip", "netns", "exec", namespace, *env, sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-id", "two-hosts", "--rdzv-endpoint", f"{HOSTS[0][0]}:{PORT}",
        "--rdzv-conf", f"is_host={'true' if is_host else 'false'}", "--local-addr", address,
        "-m", "mini_trainer.train", *map(str, flags),
    ]  # fmt: skip


@pytest.mark.slow
def test_two_hosts_train_the_same_weights_as_one_host_with_two_ranks(
    two_hosts, trained_run, demo_dir, tmp_path
):
    out = tmp_path / "run"
    flags = base_flags(demo_dir, out, **trained_run.flags)
    processes = [
        subprocess.Popen(
            _host_command(namespace, veth, address, index == 0, flags),
            env=subprocess_env(),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for index, (namespace, veth, address) in enumerate(two_hosts)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-4000:]
    assert "2 ranks on cpu" in outputs[0] + outputs[1]
    got = load_file(out / "final" / "model.safetensors")
    want = load_file(trained_run.out / "final" / "model.safetensors")
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7, msg=key)

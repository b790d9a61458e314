"""`TorchrunArgs`: how many processes on how many nodes, and how they meet (the launcher's
arguments, apart from the training job's own `TrainingArgs`).

`mini-trainer train` is the launcher when any of `LAUNCHER_FLAGS` is given (`split_launcher_args`
takes them out of its argv); `to_cli_args` is the same settings as torchrun's flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mini_trainer.errors import UserError


@dataclass
class TorchrunArgs:
    """How `api_train.run_training` launches torchrun."""

    nproc_per_node: int = 1
    """Processes on this node: one per GPU, or per CPU slot with gloo."""
    nnodes: int = 1
    """Nodes in the job."""
    node_rank: int = 0
    """This node's rank (ignored for a single node)."""
    rdzv_id: str = "mini-trainer"
    """Rendezvous id shared by the job's nodes."""
    rdzv_endpoint: str = ""
    """host:port of the rendezvous for several nodes; a single node runs standalone."""
    rdzv_conf: str = ""
    """Extra rendezvous settings for several nodes, like `is_host=true` (torchrun --rdzv-conf)."""
    local_addr: str = ""
    """This node's address for the rendezvous, where its host name does not resolve to it
    (torchrun --local-addr); empty: torchrun's own guess."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise UserError("torchrun: nproc_per_node and nnodes must be at least 1")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UserError("torchrun: rdzv_endpoint (host:port) is required with several nodes")

    def launcher_cli_args(self) -> list[str]:
        """These settings as `mini-trainer train` launcher flags (see `split_launcher_args`)."""
        out = ["--nproc-per-node", str(self.nproc_per_node)]
        if self.nnodes > 1:
            out += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            out += ["--rdzv-id", self.rdzv_id, "--rdzv-endpoint", self.rdzv_endpoint]
            out += ["--rdzv-conf", self.rdzv_conf] if self.rdzv_conf else []
            out += ["--local-addr", self.local_addr] if self.local_addr else []
        return out

    def to_cli_args(self) -> list[str]:
        """These settings as torchrun flags."""
        if self.nnodes == 1:
            return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(self.nproc_per_node)]
        return [
            "--nnodes",
            str(self.nnodes),
            "--nproc-per-node",
            str(self.nproc_per_node),
            "--node-rank",
            str(self.node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            self.rdzv_id,
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            *(["--rdzv-conf", self.rdzv_conf] if self.rdzv_conf else []),
            *(["--local-addr", self.local_addr] if self.local_addr else []),
        ]


LAUNCHER_FLAGS = {
    "--nproc-per-node": "nproc_per_node",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--rdzv-id": "rdzv_id",
    "--rdzv-endpoint": "rdzv_endpoint",
    "--rdzv-conf": "rdzv_conf",
    "--local-addr": "local_addr",
}
"""`mini-trainer train` flags that make it the launcher (TorchrunArgs), not a worker."""


def split_launcher_args(argv: list[str]) -> tuple[TorchrunArgs | None, list[str]]:
    """(TorchrunArgs or None when no launcher flag is given, the worker's own flags)."""
    found: dict[str, tuple[str, str]] = {}  # field -> (flag, value)
    rest: list[str] = []
    i = 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        if flag in LAUNCHER_FLAGS:
            if inline:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise UserError(f"{flag}: needs a value")
            found[LAUNCHER_FLAGS[flag]] = (flag, value)
        else:
            rest.append(argv[i])
        i += 1
    if not found:
        return None, rest
    values: dict[str, Any] = {}
    for name, (flag, value) in found.items():
        if name in ("nproc_per_node", "nnodes", "node_rank"):
            try:
                values[name] = int(value)
            except ValueError:
                raise UserError(f"{flag}: expected an integer, got {value!r}") from None
        else:
            values[name] = value
    return TorchrunArgs(**values), rest

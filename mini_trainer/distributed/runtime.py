"""Process group and device: the one place that decides CUDA or CPU.

Everything GPU-specific hangs off `Runtime.is_cuda`; the rest of the engine is the same code on
both, which is the code the CPU tests run.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from mini_trainer.distributed.env import env_world
from mini_trainer.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Runtime:
    """Where this process runs and who it is in the job."""

    rank: int
    """Global rank."""
    local_rank: int
    """Rank on this node; picks the GPU."""
    world_size: int
    """Number of processes in the job."""
    device: torch.device
    """cuda:<local_rank> on a GPU node, else cpu."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_runtime() -> Runtime:
    """Start the process group: nccl on CUDA, gloo on CPU. Works without torchrun too."""
    rank, local_rank, world_size = env_world()
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m mini_trainer.train`: world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(
        backend=backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=30)
    )
    return Runtime(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


CUBLAS_DETERMINISTIC = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
"""cuBLAS's fixed workspace, which its deterministic GEMMs need (read at its first handle)."""


@contextlib.contextmanager
def deterministic_kernels(wanted: bool, runtime: Runtime) -> Iterator[None]:
    """`--deterministic`: torch's deterministic algorithms (an op that has none is an error, not
    a silent difference), and on a GPU cuBLAS's fixed workspace and cuDNN's deterministic,
    non-benchmarked kernels, for the same bytes run to run on one machine; put back on exit (a
    job run in a test process). On the CPU the run is reproducible without it (MKL_CBWR strict;
    tested): there the flag only adds torch's check, and the bytes are the same."""
    if not wanted:
        yield
        return
    saved = (torch.are_deterministic_algorithms_enabled(), os.environ.get(CUBLAS_DETERMINISTIC[0]))
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    if runtime.is_cuda:  # before the job's first matmul makes cuBLAS's handle
        os.environ.setdefault(*CUBLAS_DETERMINISTIC)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        if saved[1] is None:
            os.environ.pop(CUBLAS_DETERMINISTIC[0], None)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(obj, runtime: Runtime, group=None):
    """Rank 0's `obj` on every rank (pickled; for small objects and error reports). `group`: a
    gloo group of every rank (a background save's), else the default group."""
    box = [obj if runtime.is_main else None]
    device = runtime.device if runtime.is_cuda and group is None else None
    dist.broadcast_object_list(box, src=0, group=group, device=device)
    return box[0]


def decided_on_main(decide: Callable[[], T], runtime: Runtime | None) -> T:
    """`decide()` run on rank 0 only, its result on every rank. A UserError it raises is raised
    on every rank too, so all ranks stop with the same one-line message instead of the others
    waiting in the next collective.

    Only the result travels (pickled): what `decide()` keeps for itself (an open cache, say)
    stays on rank 0. `runtime` None is a lone process without a process group (unit tests,
    tools): `decide()` simply runs."""
    if runtime is None:
        return decide()
    outcome = None
    if runtime.is_main:
        try:
            outcome = ("ok", decide())
        except UserError as error:
            outcome = ("error", error.lines)
    status, payload = broadcast_object(outcome, runtime)
    if status == "error":
        raise UserError(*payload)
    return payload


def all_reduce_sum(values: list[float], runtime: Runtime) -> list[float]:
    """Sum floats over ranks in one collective (fp64 so token counts stay exact)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=runtime.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def all_reduce_max(values: list[float], runtime: Runtime) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=runtime.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()

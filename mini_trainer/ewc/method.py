"""EWC as a training method: the hooks of `mini_trainer/method.py`, filled in.

The penalty `lambda/2 * sum_i F_i (theta_i - theta*_i)^2` is a sum over parameters, so under
FSDP2 it splits over the shards: each rank holds its rows of F and theta* (fp32, 8 bytes per
parameter, cut from the `ewc-fisher` files the way the weights are) and adds the penalty's
gradient `lambda * F * (theta - theta*)` to its own gradient shard in `before_optimizer_step`,
once the loss gradients are summed (so the clip and the logged norm see the total, as if the
penalty were in the loss). No collective is needed for the gradient; the local penalty sums are
all-reduced for the log only (`ewc_penalty` in metrics.jsonl). lambda 0 leaves the gradients
untouched: the run is SFT bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from mini_trainer.distributed.runtime import all_reduce_sum, decided_on_main
from mini_trainer.errors import UserError
from mini_trainer.ewc.fisher import FisherFolder, open_fisher
from mini_trainer.method import FullFineTuning, MethodContext
from mini_trainer.models.safetensors_file import read_tensor

log = logging.getLogger("mini_trainer")
WRAPPER_PREFIX = "model."
"""The training model (`CausalLMWithLoss`) holds the Hugging Face model as `.model`."""


def local(tensor: Tensor) -> Tensor:
    """This rank's rows of a DTensor (a view), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard_like(param: Tensor, full: Tensor) -> Tensor:
    """This rank's rows of `full`, cut as `param` is sharded (no collective)."""
    if isinstance(param, DTensor):
        return distribute_tensor(
            full, param.device_mesh, param.placements, src_data_rank=None
        ).to_local()
    return full


class EWC(FullFineTuning):
    """Elastic Weight Consolidation, online form (`methods/ewc.py`, `ewc/fisher.py`)."""

    name = "ewc"
    state_bytes_per_trainable = 8
    """F and theta* in fp32 on each trainable parameter's shard (with a Fisher folder)."""

    def __init__(self, args):
        self.args = args
        self.lam = float(args.ewc_lambda)
        self.runtime = None
        self.meta: dict | None = None
        self._terms: list[tuple[nn.Parameter, Tensor, Tensor]] | None = None
        self._penalty: Tensor | None = None

    def adapt_model(self, model: nn.Module, context: MethodContext | None = None) -> None:
        """Rank 0 checks the Fisher folder (files, and the weights it was taken at)."""
        self.runtime = context.runtime if context is not None else None
        if self.args.ewc_fisher is None:
            if context is None or context.is_main:
                log.info("ewc: no --ewc-fisher (a first stage): the penalty is 0")
            return

        def check() -> dict:
            folder = open_fisher(Path(self.args.ewc_fisher))
            folder.check_model(Path(self.args.model_name_or_path))
            return folder.meta

        self.meta = decided_on_main(check, self.runtime)

    def _load(self, model: nn.Module) -> list[tuple[nn.Parameter, Tensor, Tensor]]:
        """(parameter, F rows, theta* rows) of every trainable parameter, on its device."""
        if self._terms is None:
            # checked on rank 0 in adapt_model; every rank reads one tensor at a time
            folder = FisherFolder(Path(self.args.ewc_fisher), self.meta or {})
            fisher, anchor = folder.entries()
            terms = []
            for name, param in model.named_parameters():
                key = name.removeprefix(WRAPPER_PREFIX)
                if not param.requires_grad:
                    continue
                if key not in fisher or key not in anchor:
                    raise UserError(f"--ewc-fisher {self.args.ewc_fisher}: no entry for {key}")
                if tuple(fisher[key].shape) != tuple(param.shape):
                    raise UserError(
                        f"--ewc-fisher {self.args.ewc_fisher}: {key} has shape "
                        f"{list(fisher[key].shape)}, the model {list(param.shape)}"
                    )
                device = local(param).device
                terms.append((
                    param,
                    shard_like(param, read_tensor(fisher[key]).float()).to(device),
                    shard_like(param, read_tensor(anchor[key]).float()).to(device),
                ))  # fmt: skip
            self._terms = terms
        return self._terms

    def before_optimizer_step(self, model: nn.Module) -> None:
        """Add lambda F (theta - theta*) to each gradient shard; keep the local penalty."""
        if self.args.ewc_fisher is None:
            return
        terms = self._load(model)
        device = terms[0][1].device if terms else "cpu"
        penalty = torch.zeros((), dtype=torch.float64, device=device)  # no host sync per term
        for param, fisher, anchor in terms:
            diff = local(param).detach().float() - anchor
            penalty += (fisher * diff * diff).sum().double()
            if self.lam and param.grad is not None:
                grad = local(param.grad)
                grad.add_((fisher * diff).to(grad.dtype), alpha=self.lam)
        self._penalty = penalty * (self.lam / 2)

    def step_metrics(self) -> dict[str, float]:
        """`ewc_penalty`: lambda/2 sum F (theta - theta*)^2 at the step's weights, all ranks."""
        if self._penalty is None:
            return {}
        value = float(self._penalty)  # the step's one host sync for the penalty
        if self.runtime is not None:
            (value,) = all_reduce_sum([value], self.runtime)
        return {"ewc_penalty": value}

    def describe(self) -> dict:
        return {
            "method": self.name,
            "lambda": self.lam,
            "fisher": self.args.ewc_fisher,
            "fisher_meta": self.meta,
        }

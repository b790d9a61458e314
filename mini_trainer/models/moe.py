"""Mixture-of-experts routing: the router's auxiliary loss as the family defines it, the tokens
each expert took, and the share of expert parameters a token uses.

A family with a load-balancing loss (Mixtral, Qwen3-MoE, gpt-oss, Granite-MoE) defines it in its
own modeling module (`load_balancing_loss_func(router_logits, num_experts, top_k, mask)`) and
adds `router_aux_loss_coef *` it to the loss when its config sets `output_router_logits`. The
engine calls that same function, on each packed micro-batch's router logits (every token of the
row is routed; packed rows have no padding), and follows the same switch: the term enters the
loss only when the model's config trains it, and is logged either way.

Normalization (the aux term's own, beside the LM loss's exact token mean): the load-balancing
loss is a product of two means over the tokens it sees, so it does not split into per-token
terms. Each micro-batch's value is weighted by that micro-batch's share of the step's loss
tokens, so the weights sum to one over the step, whatever the split into micro-batches and
ranks; with one micro-batch on one rank it is transformers' own value for that row.

DeepSeek-V3 routes without an auxiliary loss (a bias per expert): nothing is added, and its
expert counts are not logged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Routing:
    """How one model routes, read off the model."""

    experts: int
    top_k: int
    aux_coef: float
    """The weight of the load-balancing loss in the training loss (0: the config does not
    train it, `output_router_logits` false)."""
    loss_fn: Callable
    """The family's own `load_balancing_loss_func`."""


def routing(model: nn.Module) -> Routing | None:
    """The routing of a Hugging Face causal LM with a load-balancing loss, else None."""
    module = sys.modules.get(type(model).__module__)
    loss_fn = getattr(module, "load_balancing_loss_func", None)
    experts = getattr(model, "num_experts", None)
    top_k = getattr(model, "num_experts_per_tok", None)
    if loss_fn is None or experts is None or top_k is None:
        return None
    train_it = bool(getattr(model.config, "output_router_logits", False))
    coef = float(getattr(model, "router_aux_loss_coef", 0.0)) if train_it else 0.0
    return Routing(int(experts), int(top_k), coef, loss_fn)


class RouterStats:
    """One rank's routing figures of one optimizer step, accumulated micro-batch by micro-batch
    on the device (no host sync until the step's end): [sum of loss-token-weighted aux values,
    the aux terms added to the loss, tokens per expert...]."""

    def __init__(self, routing: Routing, device):
        self.routing = routing
        self.totals = torch.zeros(2 + routing.experts, dtype=torch.float64, device=device)

    def add(self, router_logits: tuple[torch.Tensor, ...], loss_tokens: torch.Tensor):
        """The aux term of one micro-batch to add to its summed loss (a tensor with a graph)."""
        aux = self.routing.loss_fn(router_logits, self.routing.experts, self.routing.top_k, None)
        term = self.routing.aux_coef * loss_tokens * aux
        with torch.no_grad():
            counts = sum(expert_counts(logits, self.routing) for logits in router_logits)
            self.totals[0] += (loss_tokens * aux).double()
            self.totals[1] += term.double()
            self.totals[2:] += counts.double()
        return term


def expert_counts(router_logits: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Tokens routed to each expert by one layer (each token counts top_k times)."""
    _, chosen = torch.topk(router_logits.float(), routing.top_k, dim=-1)
    chosen = chosen.reshape(-1)
    counts = torch.zeros(routing.experts, dtype=torch.float32, device=chosen.device)
    # scatter_add_, not bincount: bincount reads its maximum back to the host (a sync on CUDA)
    return counts.scatter_add_(0, chosen, torch.ones_like(chosen, dtype=torch.float32))


def step_fields(totals: list[float], loss_tokens: int) -> dict:
    """The metrics.jsonl fields of one step from the all-reduced totals."""
    return {
        "aux_loss": totals[0] / loss_tokens,
        "expert_tokens": [int(count) for count in totals[2:]],
    }


def expert_parameters(model: nn.Module) -> int:
    """Elements of the routed experts' parameters (modules named `experts`; a shared expert is
    named otherwise and counts as dense)."""
    seen: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "experts":
            continue
        for param in module.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                total += param.numel()
    return total


def active_fraction(model: nn.Module) -> float:
    """The share of the routed experts' parameters one token uses (top_k / experts), 1.0 for a
    dense model. Read from the config, so DeepSeek-V3 (no aux loss) counts too."""
    config = model.config
    top_k = getattr(config, "num_experts_per_tok", None)
    experts = next(
        (
            getattr(config, key)
            for key in ("num_local_experts", "num_experts", "n_routed_experts")
            if getattr(config, key, None)
        ),
        None,
    )
    if not top_k or not experts:
        return 1.0
    return min(1.0, int(top_k) / int(experts))

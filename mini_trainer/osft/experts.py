"""OSFT on a mixture of experts' fused weights: each expert's matrix factorized on its own.

transformers 5 keeps a layer's routed experts as 3-D parameters (`experts.gate_up_proj`,
E x rows x cols) that the experts' forward reads as attributes. A target there becomes an
`OSFTExpertWeight`: the same six parts as `OSFTLinear`, each with a leading experts dimension
(W_high E x rows x cols, U_low E x rows x (r - k), ...), so FSDP2 shards them by experts and
every expert's projection is local to the rank that holds it. The experts module keeps its
class's forward; its class is swapped for a subclass in which the weight's name is a property
that composes W = W_high + U_low S_low V_lowᵀ per expert, once per forward (cached for the
forward, so an expert loop does not compose E times); outside a forward the name is the
`OSFTExpertWeight` module itself, as state-dict walks by attribute (torch.distributed
.checkpoint's) expect. Autograd carries the low factors'
gradients through that composition (a dense E x rows x cols gradient per layer, transient).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mini_trainer.osft.svd import (
    TRAINABLE_FACTORS,
    basis_name,
    compose,
    part_shapes,
    projection_pairs,
)


class OSFTExpertWeight(nn.Module):
    """A fused experts weight stored as per-expert frozen parts and trainable low factors."""

    def __init__(self, experts: int, rows: int, cols: int, frozen_rank: int, device=None,
                 dtype=None):  # fmt: skip
        super().__init__()
        self.experts, self.rows, self.cols = experts, rows, cols
        rank = min(rows, cols)
        self.frozen_rank, self.rank = frozen_rank, rank
        self.u_basis = basis_name("U", rows, rank, frozen_rank)
        self.v_basis = basis_name("V", cols, rank, frozen_rank)
        for name, shape in part_shapes(rows, cols, frozen_rank).items():
            tensor = torch.empty((experts, *shape), device=device, dtype=dtype)
            self.register_parameter(
                name, nn.Parameter(tensor, requires_grad=name in TRAINABLE_FACTORS)
            )

    @property
    def dense_weight_numel(self) -> int:
        """The dense weight this stands for (`training/flops.py` scales it by top-k / E)."""
        return self.experts * self.rows * self.cols

    def forward(self) -> Tensor:
        """The experts' dense weight, E x rows x cols."""
        return compose(self.W_high, self.U_low, self.S_low, self.V_low)

    def projection_pairs(self, gradients: bool) -> list[tuple[Tensor, Tensor, bool]]:
        """As `OSFTLinear.projection_pairs`; the pairs are 3-D (one matrix per expert)."""
        return projection_pairs(self, gradients)

    def extra_repr(self) -> str:
        return (
            f"experts={self.experts}, rows={self.rows}, cols={self.cols}, "
            f"frozen_rank={self.frozen_rank}/{self.rank}"
        )


def expert_weights(model: nn.Module) -> dict[str, tuple[int, int, int]]:
    """Every routed experts' 3-D weight inside the decoder layers: parameter name ->
    (experts, rows, cols). Biases (2-D) and routers are not among them."""
    layer_ids = {id(layer) for layer in getattr(model.get_decoder(), "layers", None) or []}
    found = {}
    for layer_name, layer in model.named_modules():
        if id(layer) not in layer_ids:
            continue
        for name, module in layer.named_modules(prefix=layer_name):
            if name.rsplit(".", 1)[-1] != "experts":
                continue
            for param_name, param in module.named_parameters(recurse=False):
                if param.dim() == 3:
                    found[f"{name}.{param_name}"] = tuple(param.shape)
    return found


_PATCHED: dict[tuple[type, tuple[str, ...]], type] = {}


def factorize(model: nn.Module, name: str, replacement: OSFTExpertWeight) -> None:
    """Put `replacement` in place of the experts parameter `name` (its module keeps reading
    the same attribute, now composed)."""
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    del owner._parameters[attr]
    owner.add_module(attr, replacement)  # state-dict keys: <name>.W_high, <name>.U_low, ...
    base = getattr(owner, "_osft_base", type(owner))
    names = tuple(sorted({*getattr(owner, "_osft_weights", ()), attr}))
    key = (base, names)
    if key not in _PATCHED:
        _PATCHED[key] = _composing_class(base, names)
    owner.__class__ = _PATCHED[key]


def _composing_class(base: type, names: tuple[str, ...]) -> type:
    """`base` with each of `names` read as its factorized weight, composed once per forward."""

    def forward(self, *args, **kwargs):
        self._osft_composed = {}
        try:
            return base.forward(self, *args, **kwargs)
        finally:
            self._osft_composed = None

    def weight(attr: str) -> property:
        def get(self):
            composed = self.__dict__.get("_osft_composed")
            if composed is None:  # outside a forward: the module (state-dict walks find it)
                return self._modules[attr]
            if attr not in composed:
                composed[attr] = self._modules[attr]()
            return composed[attr]

        return property(get)

    members = {name: weight(name) for name in names}
    members.update(forward=forward, _osft_base=base, _osft_weights=names)
    return type(f"OSFT{base.__name__}", (base,), members)

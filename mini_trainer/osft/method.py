"""OSFT as a training method: the hooks of `mini_trainer/method.py`, filled in.

- adapt_model: pick the targets, decide each one's frozen rank k (uniform: floor((1 - u) r);
  adaptive: per layer, see `adaptive.py`), check the SVD cache, and swap each target whose
  0 < k < r for an `OSFTLinear`. k = r (u = 0) keeps the dense weight, frozen; k = 0 (u = 1) keeps
  it dense and trainable: there is no subspace to protect.
- convert_weights: a target's dense weight becomes its frozen part W_high and its factors (from
  the cache, or an SVD).
- before/after_optimizer_step: project the low factors' gradients (before the clip), then the
  low factors themselves, off the frozen ones (`projection.py`): the frozen subspace is held
  exactly.
- export_weights: a target's parts become its dense weight again (W_high + U_low S_low V_lowᵀ).
A mixture of experts' fused 3-D weight is a target too (`experts.py`): every expert's matrix
split with the same k, its parts carrying the experts dimension; its key is the parameter's own
name (no `.weight`).
convert_weights and export_weights take any subset of a state dict: every target is converted
from its own weight alone, and exported from its own parts alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import Tensor, nn

from mini_trainer.distributed.runtime import decided_on_main
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.method import DESCRIPTION_FILE, MethodContext, is_no_decay, norm_parameter_names
from mini_trainer.osft import svd
from mini_trainer.osft.adaptive import frozen_fraction, measure
from mini_trainer.osft.cache import SVDCache
from mini_trainer.osft.experts import OSFTExpertWeight, expert_weights, factorize
from mini_trainer.osft.linear import OSFTLinear
from mini_trainer.osft.projection import remove_frozen_components
from mini_trainer.osft.targets import candidate_linears, layer_index, select_targets

log = logging.getLogger("mini_trainer")
WRAPPER_PREFIX = "model."
"""The training model (`CausalLMWithLoss`) holds the Hugging Face model as `.model`."""
RANKS_FILE = "osft_ranks.json"
NOT_DECAYED = (".U_low", ".V_low")
"""Direction factors are not decayed; S_low is, so W_low decays as a dense weight would."""


@dataclass
class Target:
    """One factorized weight: its shape, rank r and frozen rank k."""

    rows: int
    cols: int
    rank: int
    frozen: int
    experts: int = 0
    """A fused experts weight of this many experts (each rows x cols); 0 for a linear layer."""

    @property
    def factorized(self) -> bool:
        return 0 < self.frozen < self.rank


class OSFT:
    """Orthogonal Subspace Fine-Tuning (arXiv:2504.07097) behind the method hooks."""

    name = "osft"
    state_bytes_per_trainable = 0
    """No state beside the factors (which the plan counts as parameters)."""
    keeps_teacher = False

    def __init__(self, args):
        self.args = args
        self.targets: dict[str, Target] = {}
        self.layers: dict[int, dict] = {}
        self.cache = None
        self._osft_modules: list[OSFTLinear | OSFTExpertWeight] | None = None

    # ------------------------------------------------------------------ model

    def adapt_model(self, model: nn.Module, context: MethodContext | None = None) -> None:
        if context is None:  # a lone process (tests, benchmarks): a fresh start
            context = MethodContext(None, Path(self.args.output_dir), None)
        linears = candidate_linears(model)
        experts = expert_weights(model)
        names = select_targets([*linears, *experts], self.args.osft_target_patterns)
        names.sort(key=layer_index)  # model order by layer (stable: linears, then experts)
        shapes = {
            n: experts[n] if n in experts else (linears[n].out_features, linears[n].in_features)
            for n in names
        }

        def decide() -> dict[int, dict]:
            # Rank 0 measures (adaptive) and checks the cache; every rank gets the layers or the
            # error. The open cache stays on rank 0: only convert_weights uses it, on rank 0.
            layers = self._layer_fractions(names, context)
            self.cache = self._open_cache(shapes)
            return layers

        self.layers = decided_on_main(decide, context.runtime)
        for name in names:
            *count, rows, cols = shapes[name]
            fraction = self.layers[layer_index(name)]["frozen_fraction"]
            rank = min(rows, cols)
            frozen = svd.frozen_rank(rank, fraction)
            self.targets[name] = Target(rows, cols, rank, frozen, count[0] if count else 0)
        for name, target in self.targets.items():
            if target.experts:
                self._adapt_experts(model, name, target)
                continue
            linear = linears[name]
            if target.factorized:
                replacement = OSFTLinear(
                    target.cols, target.rows, target.frozen, linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype,
                )  # fmt: skip
                parent_name, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent_name), child, replacement)
            elif target.frozen == target.rank:
                linear.weight.requires_grad_(False)
        if self.args.osft_freeze_non_targets:
            self._freeze_non_targets(model)
        if context.is_main:
            self._record(context.out)

    def _adapt_experts(self, model: nn.Module, name: str, target: Target) -> None:
        weight = model.get_parameter(name)
        if target.factorized:
            replacement = OSFTExpertWeight(
                target.experts, target.rows, target.cols, target.frozen,
                device=weight.device, dtype=weight.dtype,
            )  # fmt: skip
            factorize(model, name, replacement)
        elif target.frozen == target.rank:
            weight.requires_grad_(False)

    def _layer_fractions(self, names: list[str], context: MethodContext) -> dict[int, dict]:
        """Frozen fraction per decoder layer (and its importance in adaptive mode)."""
        indices = sorted({layer_index(n) for n in names})
        args = self.args
        if args.osft_rank_mode == "uniform":
            return {i: {"frozen_fraction": 1.0 - args.osft_unfreeze_rank_ratio} for i in indices}
        if context.resumed_from is not None:  # the ranks the saved state was trained with
            saved = saved_layers(context.out)
            if saved is not None:
                return saved
            log.warning("osft: no recorded ranks in %s; measuring them again", context.out)
        importance = measure(args.model_name_or_path, args.data_path, args.seed)
        return {
            i: {
                "importance": importance[i],
                "frozen_fraction": frozen_fraction(
                    importance[i], args.osft_min_frozen_ratio, args.osft_max_frozen_ratio
                ),
            }
            for i in indices
        }

    def _open_cache(self, shapes: dict[str, tuple[int, int]]):
        if not self.args.osft_svd_cache:
            return None
        return SVDCache.open(
            Path(self.args.osft_svd_cache),
            Path(self.args.model_name_or_path),
            self.args.osft_target_patterns,
            shapes,
        )

    def _freeze_non_targets(self, model: nn.Module) -> None:
        trained = {f"{n}.{p}" for n in self.targets for p in svd.TRAINABLE_FACTORS}
        trained |= {_dense_key(n, t) for n, t in self.targets.items() if t.frozen == 0}
        for name, param in model.named_parameters():
            if name not in trained:
                param.requires_grad_(False)

    def _record(self, out: Path) -> None:
        """Log the chosen ranks and write them to OUT/osft_ranks.json (the description, kept
        under its own name too: runs and tools before OUT/method.json read it there)."""
        for index, layer in sorted(self.layers.items()):
            frozen = [t.frozen for n, t in self.targets.items() if layer_index(n) == index]
            ranks = [t.rank for n, t in self.targets.items() if layer_index(n) == index]
            importance = layer.get("importance")
            log.info(
                "osft: layer %d%s: frozen fraction %.3f, frozen ranks %s of %s", index,
                "" if importance is None else f" (importance {importance:.3f})",
                layer["frozen_fraction"], frozen, ranks,
            )  # fmt: skip
        log.info(
            "osft: %d targets, %s", len(self.targets),
            "SVD from cache " + self.args.osft_svd_cache if self.cache else "SVD computed here",
        )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / RANKS_FILE, json.dumps(self.describe(), indent=2) + "\n")

    # ------------------------------------------------------------------ weights

    def _target_of(self, key: str, suffixes: tuple[str, ...]) -> tuple[str, str, str] | None:
        """(key prefix, target module, suffix) when `key` is `[model.]<target>.<suffix>`."""
        base, _, suffix = key.rpartition(".")
        if suffix not in suffixes:
            return None
        for prefix in ("", WRAPPER_PREFIX):
            if base.startswith(prefix) and base[len(prefix) :] in self.targets:
                return prefix, base[len(prefix) :], suffix
        return None

    def _dense_target_of(self, key: str) -> tuple[str, str] | None:
        """(key prefix, target) when `key` is a target's dense weight: `[model.]<target>.weight`
        for a linear layer, `[model.]<target>` for a fused experts weight."""
        found = self._target_of(key, ("weight",))
        if found is not None and not self.targets[found[1]].experts:
            return found[0], found[1]
        for prefix in ("", WRAPPER_PREFIX):
            name = key[len(prefix) :] if key.startswith(prefix) else None
            if name in self.targets and self.targets[name].experts:
                return prefix, name
        return None

    def convert_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        for key, value in state.items():
            found = self._dense_target_of(key)
            if found is None or not self.targets[found[1]].factorized:
                out[key] = value
                continue
            prefix, name = found
            target = self.targets[name]
            expected = (target.experts,) * bool(target.experts) + (target.rows, target.cols)
            if tuple(value.shape) != expected:
                raise UserError(f"{key}: shape {list(value.shape)}, expected the model's")
            u, s, v = self.cache.factors(name) if self.cache else svd.thin_svd(value)
            for part, tensor in svd.split(value, u, s, v, target.frozen).items():
                out[f"{prefix}{name}.{part}"] = tensor
        return out

    def export_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out, pending = {}, {}
        for key, value in state.items():
            found = self._target_of(key, svd.PART_NAMES)
            if found is None:
                out[key] = value
                continue
            prefix, name, part = found
            pending.setdefault((prefix, name), {})[part] = value
        for (prefix, name), factors in pending.items():
            missing = [part for part in svd.DENSE_PARTS if part not in factors]
            if missing:
                raise ValueError(f"export_weights: {name} without its {', '.join(missing)}")
            out[prefix + _dense_key(name, self.targets[name])] = svd.dense(factors)
        return out

    # ------------------------------------------------------------------ optimizer

    def param_groups(self, model: nn.Module, weight_decay: float) -> list[dict]:
        norms = norm_parameter_names(model)
        decay, no_decay = [], []
        for name, param in model.named_parameters():
            if param.requires_grad:
                kept = is_no_decay(name, param, norms) or name.endswith(NOT_DECAYED)
                (no_decay if kept else decay).append(param)
        groups = [
            {"params": decay, "weight_decay": weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
        ]
        groups = [group for group in groups if group["params"]]
        if not groups:
            raise UserError("--osft: nothing trains (all targets frozen and non-targets frozen)")
        return groups

    def _modules(self, model: nn.Module) -> list[OSFTLinear | OSFTExpertWeight]:
        if self._osft_modules is None:
            kinds = (OSFTLinear, OSFTExpertWeight)
            self._osft_modules = [m for m in model.modules() if isinstance(m, kinds)]
        return self._osft_modules

    def before_optimizer_step(self, model: nn.Module) -> None:
        pairs = [p for module in self._modules(model) for p in module.projection_pairs(True)]
        remove_frozen_components(pairs)

    def after_optimizer_step(self, model: nn.Module) -> None:
        pairs = [p for module in self._modules(model) for p in module.projection_pairs(False)]
        remove_frozen_components(pairs)

    def step_metrics(self) -> dict[str, float]:
        return {}

    def micro_batch_loss(self, micro, attention_kwargs: dict):
        return None

    def describe(self) -> dict:
        args = self.args
        return {
            "method": self.name,
            "rank_mode": args.osft_rank_mode,
            "unfreeze_rank_ratio": args.osft_unfreeze_rank_ratio,
            "min_frozen_ratio": args.osft_min_frozen_ratio,
            "max_frozen_ratio": args.osft_max_frozen_ratio,
            "svd_cache": args.osft_svd_cache,
            "layers": {str(i): layer for i, layer in sorted(self.layers.items())},
            "targets": {name: asdict(target) for name, target in self.targets.items()},
        }


def _dense_key(name: str, target: Target) -> str:
    """The dense weight's key of a target: `<module>.weight`, or the experts parameter's name."""
    return name if target.experts else f"{name}.weight"


def saved_layers(out: Path) -> dict[int, dict] | None:
    """The adaptive ranks a run in `out` recorded: OUT/method.json (an OSFT description), or
    OUT/osft_ranks.json (the only record of runs before method.json); None when neither has
    them."""
    for name in (DESCRIPTION_FILE, RANKS_FILE):
        path = out / name
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        layers = recorded.get("layers") if isinstance(recorded, dict) else None
        if isinstance(layers, dict) and layers and recorded.get("rank_mode") == "adaptive":
            log.info("osft: adaptive ranks from %s", path)
            return {int(i): layer for i, layer in layers.items()}
    return None

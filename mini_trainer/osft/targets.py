"""Which weights OSFT factorizes: the linear layers of the attention and MLP blocks.

Targets are the 2-D weights of `nn.Linear` modules inside the decoder layers. By default they are
picked by the module's own name (q/k/v/o and gate/up/down projections in Llama, Qwen and Mistral;
the fused or differently named projections of other families; DeepSeek-V3's MLA projections and
shared experts). Routers are never targets (in transformers 5 they are router modules, not
`nn.Linear`), and neither are routed experts, whose fused 3-D weights are not linear modules.
`--osft-target-patterns` replaces the default with substrings of parameter names. Embeddings,
norms and the LM head are never targets: they live outside the decoder layers.
"""

from __future__ import annotations

from torch import nn

from mini_trainer.errors import UserError

DEFAULT_MODULE_NAMES = (
    # Llama, Qwen2/3, Mistral, Mixtral attention, Gemma, OLMo, Granite
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    # Phi-3 (fused), GPT-NeoX / Falcon / Bloom, OPT / GPT-J / BART, StarCoder2, DBRX
    "qkv_proj", "gate_up_proj", "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h",
    "out_proj", "fc1", "fc2", "fc_in", "fc_out", "c_fc", "c_proj", "Wqkv", "w1", "w2", "w3",
    # DeepSeek-V3's MLA: low-rank query and key/value projections
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
)  # fmt: skip
"""Last component of a linear module's name that makes it a default target."""


def candidate_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every `nn.Linear` inside the decoder layers, by module name (as in `named_modules`)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise UserError(f"{type(model).__name__}: no decoder .layers (unsupported model for OSFT)")
    layer_ids = {id(layer) for layer in layers}
    found: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        if id(module) in layer_ids:
            for sub_name, sub in module.named_modules():
                if isinstance(sub, nn.Linear) and sub_name:
                    found[f"{name}.{sub_name}"] = sub
    return found


def select_targets(module_names: list[str], patterns: list[str] | None) -> list[str]:
    """Module names to factorize, in model order; a pattern that matches nothing is an error.

    Patterns are substrings of the weight's parameter name (`...q_proj.weight`); without
    patterns the module's last name component must be one of `DEFAULT_MODULE_NAMES`.
    """
    if patterns is None:
        chosen = [n for n in module_names if n.rsplit(".", 1)[-1] in DEFAULT_MODULE_NAMES]
        if not chosen:
            raise UserError(
                "--osft-target-patterns: none of this model's linear layers has a known "
                "projection name; give the patterns to target"
            )
        return chosen
    unmatched = [p for p in patterns if not any(p in f"{n}.weight" for n in module_names)]
    if unmatched:
        raise UserError(
            f"--osft-target-patterns: {', '.join(map(repr, unmatched))} matches no linear weight "
            f"of the decoder layers (e.g. {module_names[0]}.weight)"
        )
    return [n for n in module_names if any(p in f"{n}.weight" for p in patterns)]


def layer_index(module_name: str) -> int:
    """The decoder layer a target belongs to (`model.layers.3.mlp.up_proj` -> 3)."""
    parts = module_name.split(".")
    for before, part in zip(parts, parts[1:], strict=False):
        if before == "layers" and part.isdigit():
            return int(part)
    raise ValueError(f"{module_name}: not inside a decoder layer")

"""OSFT in one process: targets, the split, the factorized layer, the projections, conversion
and export of any subset of a state dict, the SVD cache's checks and adaptive ranks."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import helpers
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

from mini_trainer.errors import UserError
from mini_trainer.osft import svd
from mini_trainer.osft.build import build_cache
from mini_trainer.osft.linear import OSFTLinear
from mini_trainer.osft.method import OSFT
from mini_trainer.osft.targets import candidate_linears, select_targets
from mini_trainer.training_args import TrainingArgs

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama(layers=2, seed=0, **overrides):
    sizes = dict(vocab_size=64, intermediate_size=48, num_hidden_layers=layers)
    return helpers.tiny_llama(seed=seed, **{**sizes, **overrides})


def osft_args(tmp_path, **overrides) -> SimpleNamespace:
    values = dict(
        osft_unfreeze_rank_ratio=0.25, osft_target_patterns=None, osft_rank_mode="uniform",
        osft_min_frozen_ratio=0.1, osft_max_frozen_ratio=0.8, osft_svd_cache=None,
        osft_freeze_non_targets=False, output_dir=str(tmp_path / "out"), resume=False,
        model_name_or_path=str(tmp_path / "model"), data_path=str(tmp_path / "data.jsonl"),
        seed=0,
    )  # fmt: skip
    values.update(overrides)
    return SimpleNamespace(**values)


def adapted(model_source, args):
    """(method, model): `model_source`'s architecture adapted by OSFT, loaded with its weights."""
    method = OSFT(args)
    model = type(model_source)(model_source.config)
    method.adapt_model(model)
    model.load_state_dict(method.convert_weights(model_source.state_dict()), strict=True)
    return method, model


def train_steps(method, model, steps, weight_decay=0.1, lr=1e-2):
    optimizer = torch.optim.AdamW(method.param_groups(model, weight_decay), lr=lr)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        method.before_optimizer_step(model)
        optimizer.step()
        method.after_optimizer_step(model)
        optimizer.zero_grad()


# ---------------------------------------------------------------------------- targets, split


def test_default_targets_are_the_projections_and_a_pattern_matching_nothing_is_an_error():
    names = list(candidate_linears(tiny_llama()))
    chosen = select_targets(names, None)
    assert len(chosen) == 2 * 7 and {n.rsplit(".", 1)[1] for n in chosen} == set(PROJECTIONS)
    assert not any("lm_head" in n or "embed" in n for n in names)
    assert select_targets(names, ["q_proj", "layers.1.mlp.down"]) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.mlp.down_proj",
    ]
    with pytest.raises(UserError, match="'qq_proj' matches no linear weight"):
        select_targets(names, ["q_proj", "qq_proj"])


def test_frozen_rank_is_the_floor_of_the_frozen_share():
    assert svd.frozen_rank(128, 1 - 0.25) == 96
    assert svd.frozen_rank(10, 1 - 0.9) == 1  # (1 - 0.9) * 10 is 0.999... in floats
    assert svd.frozen_rank(7, 1.0) == 7 and svd.frozen_rank(7, 0.0) == 0
    assert svd.frozen_rank(7, 0.5) == 3


def test_split_reconstructs_the_weight_and_its_frozen_part_is_the_top_triplets():
    weight = torch.randn(12, 8, dtype=torch.float64).float()
    u, s, v = svd.thin_svd(weight, torch.device("cpu"))
    factors = svd.split(weight, u, s, v, k=5)
    assert factors["U_high"].shape == (12, 5) and factors["V_low"].shape == (8, 3)
    assert factors["W_high"].shape == (12, 8) and set(factors) == set(svd.part_shapes(12, 8, 5))
    torch.testing.assert_close(svd.dense(factors), weight, rtol=1e-5, atol=1e-5)
    top = (u[:, :5] * s[:5]) @ v[:, :5].mT
    torch.testing.assert_close(factors["W_high"], top, rtol=1e-5, atol=1e-5)


def test_factorized_linear_gives_the_dense_layers_output_and_gradients():
    torch.manual_seed(0)
    weight, bias = torch.randn(12, 8), torch.randn(12)
    factors = svd.split(weight, *svd.thin_svd(weight, torch.device("cpu")), k=5)
    layer = OSFTLinear(8, 12, frozen_rank=5, bias=True)
    layer.load_state_dict({**factors, "bias": bias})
    x = torch.randn(2, 3, 8, requires_grad=True)
    out = layer(x)
    out.square().sum().backward()

    ref = {name: t.clone().requires_grad_(True) for name, t in {**factors, "bias": bias}.items()}
    x_ref = x.detach().clone().requires_grad_(True)
    expected = F.linear(x_ref, svd.dense(ref), ref["bias"])
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for name in ("U_low", "S_low", "V_low", "bias"):
        torch.testing.assert_close(getattr(layer, name).grad, ref[name].grad, msg=name)
    frozen = set(factors) - set(svd.TRAINABLE_FACTORS)
    assert frozen == {"W_high", "U_high", "V_low_init"}  # U: 12 rows > r = 8; V: 8 = r, 3 < 5
    for name in frozen:
        assert getattr(layer, name).grad is None and not getattr(layer, name).requires_grad


@pytest.mark.parametrize("rows,cols,k", [(12, 12, 9), (12, 12, 3), (12, 8, 6), (8, 12, 6)])
def test_each_side_keeps_the_cheaper_basis_and_both_project_alike(rows, cols, k):
    """A full side (dim = r) with r - k < k keeps the complement's basis (U_low as it started)
    and projects onto it; projecting off U_high gives the same. A long side keeps U_high."""
    from mini_trainer.osft.projection import remove_frozen_components

    torch.manual_seed(0)
    weight = torch.randn(rows, cols)
    u, s, v = svd.thin_svd(weight, torch.device("cpu"))
    rank = min(rows, cols)
    parts = svd.split(weight, u, s, v, k)
    for side, dim, full in (("U", rows, u), ("V", cols, v)):
        name = svd.basis_name(side, dim, rank, k)
        cheaper = dim == rank and rank - k < k
        assert name == (f"{side}_low_init" if cheaper else f"{side}_high")
        assert parts[name].shape == (dim, rank - k if cheaper else k)
        x = torch.randn(dim, rank - k)
        expected = x - full[:, :k] @ (full[:, :k].T @ x)
        remove_frozen_components([(x, parts[name], cheaper)])
        torch.testing.assert_close(x, expected, rtol=1e-5, atol=1e-5)
        assert (full[:, :k].T @ x).norm() < 1e-5 * x.norm()


# ---------------------------------------------------------------------------- method


def test_convert_and_export_work_on_any_subset(tmp_path):
    source = tiny_llama()
    method = OSFT(osft_args(tmp_path))
    with torch.device("meta"):
        meta_model = LlamaForCausalLM(source.config)
    method.adapt_model(meta_model)
    state = {f"model.{k}": v for k, v in source.state_dict().items()}  # the training wrapper's keys
    whole = method.convert_weights(state)
    one_by_one = {}
    for key, value in state.items():
        one_by_one.update(method.convert_weights({key: value}))
    assert whole.keys() == one_by_one.keys()
    for key in whole:
        torch.testing.assert_close(whole[key], one_by_one[key], rtol=0, atol=0)
    name = "model.model.layers.1.mlp.up_proj"
    assert f"{name}.weight" not in whole and f"{name}.U_low" in whole
    assert whole[f"{name}.U_high"].shape == (48, 24) and whole[f"{name}.U_low"].shape == (48, 8)

    # Export module by module (each target's parts alone), then everything at once.
    per_module = {}
    prefixes = {key.rpartition(".")[0] for key in whole}
    for prefix in prefixes:
        per_module.update(
            method.export_weights({k: v for k, v in whole.items() if k.startswith(prefix + ".")})
        )
    exported = method.export_weights(whole)
    assert exported.keys() == state.keys() == per_module.keys()
    for key in state:
        torch.testing.assert_close(exported[key], state[key], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(per_module[key], exported[key], rtol=0, atol=0)
    with pytest.raises(ValueError, match="without its"):
        method.export_weights({f"{name}.U_low": whole[f"{name}.U_low"]})


def test_frozen_subspace_is_held_after_50_adamw_steps_and_export_gives_the_same_logits(tmp_path):
    source = tiny_llama(attention_bias=True)
    method, model = adapted(source, osft_args(tmp_path))
    before = method.export_weights(model.state_dict())
    train_steps(method, model, 50, weight_decay=0.1)
    after = method.export_weights(model.state_dict())
    for name, target in method.targets.items():
        u, _, v = svd.thin_svd(source.state_dict()[f"{name}.weight"], torch.device("cpu"))
        u_k, v_k = u[:, : target.frozen], v[:, : target.frozen]
        delta = (after[f"{name}.weight"] - before[f"{name}.weight"]).double()
        assert delta.norm() > 1e-2 * before[f"{name}.weight"].norm(), f"{name} did not train"
        assert (u_k.double().T @ delta).norm() < 1e-5 * delta.norm(), name
        assert (delta @ v_k.double()).norm() < 1e-5 * delta.norm(), name

    # The exported dense weights give the factorized model's logits.
    dense = LlamaForCausalLM(source.config)
    dense.load_state_dict(after)
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(dense(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "family, targets",
    [("gpt_oss", 12), ("mixtral", 12), ("deepseek_v3", 18)],
)
def test_osft_on_other_families_holds_the_frozen_subspace(family, targets, tmp_path):
    """Sinks and biased experts (gpt-oss), routed experts (Mixtral), MLA and a shared expert
    (DeepSeek-V3; the dense families' linear targets are the demo Llama's): the default
    targets (every routed expert's matrix among them), 4 AdamW steps, no update in any
    frozen subspace (each expert's its own), export gives the same logits."""
    from families import build_model

    source = build_model(family)
    method, model = adapted(source, osft_args(tmp_path))
    assert len(method.targets) == targets
    assert not any(".gate." in name or "router" in name for name in method.targets)
    before = method.export_weights(model.state_dict())
    train_steps(method, model, 4, weight_decay=0.1)
    after = method.export_weights(model.state_dict())
    assert (
        sum(t.experts > 0 for t in method.targets.values())
        == targets - {"gpt_oss": 8, "mixtral": 8, "deepseek_v3": 16}[family]
    )
    for name, target in method.targets.items():
        key = name if target.experts else f"{name}.weight"
        u, _, v = svd.thin_svd(source.state_dict()[key], torch.device("cpu"))
        u_k, v_k = u[..., : target.frozen].double(), v[..., : target.frozen].double()
        delta = (after[key] - before[key]).double()
        assert delta.norm() > 1e-3 * before[key].norm(), f"{name} did not train"
        assert (u_k.mT @ delta).norm() < 1e-5 * delta.norm(), name
        assert (delta @ v_k).norm() < 1e-5 * delta.norm(), name
    dense = type(source)(source.config)
    dense.load_state_dict(after)
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(dense(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_without_the_correction_after_the_step_adamw_leaks_into_the_frozen_subspace(tmp_path):
    # The reason for after_optimizer_step: projecting gradients alone is not enough.
    source = tiny_llama()
    method, model = adapted(source, osft_args(tmp_path))
    method.after_optimizer_step = lambda model: None
    before = method.export_weights(model.state_dict())
    train_steps(method, model, 5, weight_decay=0.1)
    after = method.export_weights(model.state_dict())
    name = "model.layers.0.mlp.down_proj"
    u, _, _ = svd.thin_svd(source.state_dict()[f"{name}.weight"], torch.device("cpu"))
    delta = after[f"{name}.weight"] - before[f"{name}.weight"]
    u_k = u[:, : method.targets[name].frozen]
    assert (u_k.T @ delta).norm() > 1e-3 * delta.norm()


def test_the_clip_sees_the_projected_gradient(tmp_path):
    """The gradient norm is logged and clipped after the frozen components are removed: the
    returned norm is the projected gradient's, and after the clip the gradient's norm is exactly
    the limit (clipping first and projecting after would leave it below)."""
    from mini_trainer.osft.projection import remove_frozen_components
    from mini_trainer.training.optimizer import finish_gradients

    method, model = adapted(tiny_llama(), osft_args(tmp_path))
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    # Backprop leaves little of U_low's gradient in the frozen subspace; add some, so that the
    # order of projection and clip shows in the norms.
    generator = torch.Generator().manual_seed(2)
    for m in model.modules():
        if isinstance(m, OSFTLinear):  # a random matrix lies mostly in the frozen subspace
            m.U_low.grad += torch.randn(m.U_low.shape, generator=generator)

    def total_norm(model):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()

    raw = total_norm(model)
    shadow = copy.deepcopy(model)
    for param, copied in zip(model.parameters(), shadow.parameters(), strict=True):
        copied.grad = None if param.grad is None else param.grad.clone()
    remove_frozen_components(
        [p for m in shadow.modules() if isinstance(m, OSFTLinear) for p in m.projection_pairs(True)]
    )
    projected = total_norm(shadow)
    assert projected < raw * 0.9  # the frozen components are a large part of it

    limit = projected / 10
    norm = finish_gradients(model, method, grad_clip=limit)
    assert norm.item() == pytest.approx(projected, rel=1e-5)
    assert total_norm(model) == pytest.approx(limit, rel=1e-5)


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_ratio_zero_freezes_every_target_and_one_trains_them_all_densely(tmp_path, ratio):
    source = tiny_llama()
    method, model = adapted(source, osft_args(tmp_path, osft_unfreeze_rank_ratio=ratio))
    assert not any(isinstance(m, OSFTLinear) for m in model.modules())
    # ranks: 16 for k and v (2 heads of 8), 32 for the others
    assert {t.frozen for t in method.targets.values()} == ({0} if ratio else {16, 32})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_steps(method, model, 3)
    for name in method.targets:
        moved = not torch.equal(model.state_dict()[f"{name}.weight"], before[f"{name}.weight"])
        assert moved == (ratio == 1.0), name
    assert not torch.equal(model.model.norm.weight, before["model.norm.weight"])
    ranks = json.loads((tmp_path / "out" / "osft_ranks.json").read_text())
    assert len(ranks["targets"]) == 14 and ranks["unfreeze_rank_ratio"] == ratio


def test_freeze_non_targets_and_no_decay_on_direction_factors(tmp_path):
    source = tiny_llama()
    method, model = adapted(source, osft_args(tmp_path, osft_freeze_non_targets=True))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(svd.TRAINABLE_FACTORS) for n in trainable)
    groups = {g["name"]: g for g in method.param_groups(model, 0.1)}
    decayed = {id(p) for p in groups["decay"]["params"]}
    layer = model.model.layers[0].self_attn.q_proj
    assert id(layer.S_low) in decayed and id(layer.U_low) not in decayed


# ---------------------------------------------------------------------------- cache


@pytest.fixture
def saved_model(tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path / "model")
    return model


def test_cache_hit_gives_the_fresh_svd_for_any_ratio(tmp_path, saved_model):
    build_cache(tmp_path / "model", tmp_path / "cache", None, force=False)
    fresh = {}
    for ratio in (0.25, 0.5):
        for cached in (False, True):
            args = osft_args(
                tmp_path, osft_unfreeze_rank_ratio=ratio,
                osft_svd_cache=str(tmp_path / "cache") if cached else None,
            )  # fmt: skip
            _, model = adapted(saved_model, args)
            state = model.state_dict()
            if not cached:
                fresh = state
            else:
                assert state.keys() == fresh.keys()
                for key in state:
                    torch.testing.assert_close(state[key], fresh[key], rtol=0, atol=0)
    with pytest.raises(UserError, match="already exists"):
        build_cache(tmp_path / "model", tmp_path / "cache", None, force=False)
    build_cache(tmp_path / "model", tmp_path / "cache", None, force=True)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_the_svd_cache_covers_fused_experts_from_per_expert_checkpoints(family, tmp_path):
    """Mixtral's checkpoint holds one tensor per expert, gpt-oss's fused ones: osft-svd reads
    both in the model's layout, stores every expert's SVD, and training from the cache gives
    the fresh SVD's parameters exactly."""
    from families import build_model

    source = build_model(family)
    source.save_pretrained(tmp_path / "model")
    meta = build_cache(tmp_path / "model", tmp_path / "cache", None, force=False)
    experts = {n: t for n, t in meta["targets"].items() if len(t["shape"]) == 3}
    assert len(experts) == 4 and all(t["shape"][0] == 4 for t in experts.values())
    states = []
    for cache_dir in (None, str(tmp_path / "cache")):
        _, model = adapted(source, osft_args(tmp_path, osft_svd_cache=cache_dir))
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    assert any(key.endswith("experts.gate_up_proj.U_low") for key in states[0])
    for key in states[0]:
        torch.testing.assert_close(states[1][key], states[0][key], rtol=0, atol=0, msg=key)


def _open(tmp_path, cache_dir, patterns=None, model="model"):
    args = osft_args(tmp_path, osft_svd_cache=str(cache_dir), osft_target_patterns=patterns,
                     model_name_or_path=str(tmp_path / model))  # fmt: skip
    config = AutoConfig.from_pretrained(tmp_path / model)
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    OSFT(args).adapt_model(meta_model)


def test_cache_refusals_name_the_file(tmp_path, saved_model):
    cache = tmp_path / "cache"
    build_cache(tmp_path / "model", cache, None, force=False)
    _open(tmp_path, cache)  # the good cache is accepted

    with pytest.raises(UserError, match=r"missing/meta.json: no such file"):
        _open(tmp_path, tmp_path / "missing")
    with pytest.raises(UserError, match=r"cache/meta.json: patterns: the cache was built for"):
        _open(tmp_path, cache, patterns=["q_proj"])

    other = tiny_llama()
    with torch.no_grad():
        other.model.layers[1].mlp.up_proj.weight.mul_(1.001)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(UserError, match=r"cache/meta.json: source_hash: .*other"):
        _open(tmp_path, cache, model="other")

    wide = tiny_llama(intermediate_size=56)
    wide.save_pretrained(tmp_path / "wide")
    with pytest.raises(
        UserError, match=r"cache/meta.json: shape: .*gate_proj is \[48, 32\] in the cache, \[56"
    ):
        _open(tmp_path, cache, model="wide")

    (factors,) = cache.glob("factors-*.safetensors")
    data = factors.read_bytes()
    factors.write_bytes(data[:-100])
    with pytest.raises(UserError, match=rf"{factors.name}: truncated or altered"):
        _open(tmp_path, cache)
    factors.write_bytes(data[:-8] + bytes(8))  # same size, last bytes zeroed
    with pytest.raises(UserError, match=rf"{factors.name}: corrupt"):
        _open(tmp_path, cache)


def test_a_config_that_does_not_fit_its_weights_is_refused_before_any_svd(tmp_path, saved_model):
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["intermediate_size"] = 56  # the weights are 48 wide
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as error:
        build_cache(tmp_path / "model", tmp_path / "cache", None, force=False)
    assert error.value.lines == [
        f"{tmp_path / 'model' / 'model.safetensors'}: model.layers.0.mlp.gate_proj.weight: "
        "shape [48, 32], but the model expects [56, 32]"
    ]
    assert not (tmp_path / "cache").exists()


def test_cache_with_patterns_holds_only_those_targets(tmp_path, saved_model):
    meta = build_cache(tmp_path / "model", tmp_path / "cache", ["q_proj", "v_proj"], False)
    assert sorted(meta["targets"]) == sorted(
        f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")
    )
    assert meta["versions"]["torch"] == torch.__version__ and meta["dtype"] == "float32"
    _open(tmp_path, tmp_path / "cache", patterns=["q_proj", "v_proj"])


# ---------------------------------------------------------------------------- adaptive


def test_adaptive_ranks_follow_layer_importance_within_the_bounds(tmp_path):
    model = tiny_llama(layers=3)
    with torch.no_grad():  # layer 0 barely changes its input, layer 2 rewrites it
        for proj in (model.model.layers[0].self_attn.o_proj, model.model.layers[0].mlp.down_proj):
            proj.weight.mul_(1e-4)
        for proj in (model.model.layers[2].self_attn.o_proj, model.model.layers[2].mlp.down_proj):
            proj.weight.mul_(30.0)
    model.save_pretrained(tmp_path / "model")
    rows = [{"input_ids": [(7 * i + j) % 64 for j in range(20)], "labels": []} for i in range(30)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = osft_args(tmp_path, osft_rank_mode="adaptive", osft_unfreeze_rank_ratio=None,
                     osft_min_frozen_ratio=0.2, osft_max_frozen_ratio=0.9)  # fmt: skip
    method = OSFT(args)
    method.adapt_model(LlamaForCausalLM(model.config))
    layers = method.layers
    assert layers[0]["importance"] > 0.99 > layers[1]["importance"] > layers[2]["importance"]
    fractions = [layers[i]["frozen_fraction"] for i in range(3)]
    assert 0.2 <= fractions[2] < fractions[1] < fractions[0] <= 0.9
    q = [method.targets[f"model.layers.{i}.self_attn.q_proj"].frozen for i in range(3)]
    assert q[0] > q[1] > q[2] and all(int(0.2 * 32) <= k <= int(0.9 * 32) for k in q)
    saved = json.loads((tmp_path / "out" / "osft_ranks.json").read_text())
    assert saved["layers"]["2"]["importance"] == pytest.approx(layers[2]["importance"])
    assert saved["targets"]["model.layers.0.self_attn.q_proj"]["frozen"] == q[0]


# ---------------------------------------------------------------------------- arguments


def _args(**osft):
    return TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o", **osft)


def test_osft_flags_need_osft_and_consistent_bounds():
    with pytest.raises(UserError) as error:
        _args(osft_svd_cache="c", osft_rank_mode="adaptive", osft_freeze_non_targets=True)
    assert error.value.lines == [
        "--osft-svd-cache: needs --osft",
        "--osft-freeze-non-targets: needs --osft",
        "--osft-rank-mode: needs --osft",
    ]
    with pytest.raises(UserError, match="--osft-min-frozen-ratio: 0.9 is above"):
        _args(osft=True, osft_rank_mode="adaptive", osft_min_frozen_ratio=0.9)
    with pytest.raises(UserError, match="--osft-max-frozen-ratio: needs --osft-rank-mode adapt"):
        _args(osft=True, osft_unfreeze_rank_ratio=0.5, osft_max_frozen_ratio=0.5)
    with pytest.raises(UserError, match="nothing would train"):
        _args(osft=True, osft_unfreeze_rank_ratio=0.0, osft_freeze_non_targets=True)
    assert _args(osft=True, osft_rank_mode="adaptive").osft_max_frozen_ratio == 0.8

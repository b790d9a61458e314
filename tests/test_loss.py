"""The chunked linear cross-entropy against the plain formula, and the loss selector."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mini_trainer.errors import UserError
from mini_trainer.training.loss import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
    make_loss_fn,
)

N, H, V = 23, 16, 37


def make_inputs(n=N, h=H, v=V, dtype=torch.float32, ignored=0.3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[torch.rand(n, generator=gen) < ignored] = -100
    return hidden, weight, targets


def loss_and_grads(fn, hidden, weight, targets, **kwargs):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets, **kwargs)
    loss.backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk_size", [1, 7, N, N + 5])
def test_chunked_matches_reference_fp32(chunk_size):
    hidden, weight, targets = make_inputs()
    assert 0 < (targets == -100).sum() < N
    ref = loss_and_grads(linear_cross_entropy_reference, hidden, weight, targets)
    got = loss_and_grads(
        chunked_linear_cross_entropy, hidden, weight, targets, chunk_size=chunk_size
    )
    assert got[0].dtype == torch.float32 and got[0].dim() == 0
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-6)
    # Ignored rows get exactly zero gradient.
    assert torch.all(got[1][targets == -100] == 0)


def test_chunked_matches_reference_fp64_tightly():
    """In fp64 the two agree to rounding level: the formulas are the same, not just close."""
    hidden, weight, targets = make_inputs(dtype=torch.float64)
    ref = loss_and_grads(linear_cross_entropy_reference, hidden, weight, targets)
    got = loss_and_grads(chunked_linear_cross_entropy, hidden, weight, targets, chunk_size=4)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gradients_match_finite_differences_fp64():
    """Independent of autograd: central differences of the chunked loss itself.

    (torch.autograd.gradcheck cannot be used: it runs backward twice on one graph, and this
    function hands its precomputed gradients over on the first backward.)
    """
    hidden, weight, targets = make_inputs(n=5, h=3, v=7, dtype=torch.float64, ignored=0.0)
    targets[1] = -100
    _, grad_h, grad_w = loss_and_grads(
        chunked_linear_cross_entropy, hidden, weight, targets, chunk_size=2
    )
    eps = 1e-6
    for tensor, grad in ((hidden, grad_h), (weight, grad_w)):
        numeric = torch.zeros_like(grad)
        with torch.no_grad():
            for i in range(tensor.numel()):
                flat = tensor.view(-1)
                old = flat[i].item()
                flat[i] = old + eps
                up = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=2)
                flat[i] = old - eps
                down = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=2)
                flat[i] = old
                numeric.view(-1)[i] = (up - down) / (2 * eps)
        torch.testing.assert_close(grad, numeric, rtol=1e-6, atol=1e-8)


def test_all_targets_ignored_gives_zero_that_still_backpropagates():
    hidden, weight, targets = make_inputs()
    targets[:] = -100
    loss = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=4)
    assert loss.item() == 0.0
    assert loss.requires_grad and loss.grad_fn is not None
    (loss / 1.0).backward()
    for grad, like in ((hidden.grad, hidden), (weight.grad, weight)):
        assert grad is not None and grad.shape == like.shape
        assert torch.all(grad == 0) and not torch.isnan(grad).any()


def test_all_targets_ignored_with_non_finite_hidden_stays_finite():
    """A `(hidden.sum() + weight.sum()) * 0` zero would turn inf hidden values into NaN."""
    hidden, weight, targets = make_inputs()
    targets[:] = -100
    with torch.no_grad():
        hidden[0, 0] = float("inf")
    loss = chunked_linear_cross_entropy(hidden, weight, targets)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(hidden.grad == 0) and torch.all(weight.grad == 0)


def test_grad_output_scaling_and_accumulation_across_micro_batches():
    """The engine divides the sum by a token count and accumulates over micro-batches."""
    h1, weight, t1 = make_inputs(seed=1)
    h2, _, t2 = make_inputs(seed=2)
    count = int((t1 != -100).sum() + (t2 != -100).sum())
    for fn in (linear_cross_entropy_reference, chunked_linear_cross_entropy):
        weight.grad = None
        for h, t in ((h1, t1), (h2, t2)):
            h.grad = None
            (fn(h, weight, t) / count).backward()
        if fn is linear_cross_entropy_reference:
            expected = (weight.grad.clone(), h1.grad.clone(), h2.grad.clone())
    torch.testing.assert_close(weight.grad, expected[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h1.grad, expected[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h2.grad, expected[2], rtol=1e-5, atol=1e-7)


def test_frozen_weight_and_no_grad():
    hidden, weight, targets = make_inputs()
    weight.requires_grad_(False)
    loss = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=5)
    loss.backward()
    assert weight.grad is None
    got = hidden.grad
    hidden.grad = None
    ref = linear_cross_entropy_reference(hidden, weight, targets)
    ref.backward()
    torch.testing.assert_close(got, hidden.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        value = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=5)
    assert not value.requires_grad
    torch.testing.assert_close(value, ref.detach(), rtol=1e-5, atol=1e-5)


def test_second_backward_fails_clearly():
    hidden, weight, targets = make_inputs()
    loss = chunked_linear_cross_entropy(hidden, weight, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_bf16_close_to_fp32_reference():
    hidden, weight, targets = make_inputs(n=64, h=32, v=101, dtype=torch.bfloat16)
    loss, grad_h, grad_w = loss_and_grads(
        chunked_linear_cross_entropy, hidden, weight, targets, chunk_size=16
    )
    assert loss.dtype == torch.float32
    assert grad_h.dtype == torch.bfloat16 and grad_w.dtype == torch.bfloat16
    h32 = hidden.detach().float().requires_grad_()
    w32 = weight.detach().float().requires_grad_()
    ref = loss_and_grads(linear_cross_entropy_reference, h32, w32, targets)
    torch.testing.assert_close(loss, ref[0], rtol=2e-2, atol=0)
    for got, want in ((grad_h, ref[1]), (grad_w, ref[2])):
        err = (got.float() - want).abs().max() / want.abs().max()
        assert err < 3e-2, err


def test_rejects_mismatched_shapes():
    hidden, weight, targets = make_inputs()
    with pytest.raises(ValueError, match="targets must have shape"):
        chunked_linear_cross_entropy(hidden, weight, targets[:-1])
    with pytest.raises(ValueError, match=r"hidden \(N, H\) and weight \(V, H\)"):
        chunked_linear_cross_entropy(hidden, weight.T, targets)


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any aten op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materializes_full_logits():
    n, v, chunk = 64, 200, 8
    hidden, weight, targets = make_inputs(n=n, h=8, v=v, ignored=0.0)
    with _LargestOutput() as mode:
        chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=chunk).backward()
    assert mode.largest <= chunk * v
    with _LargestOutput() as mode:  # the probe does see the reference's N x V logits
        linear_cross_entropy_reference(hidden, weight, targets).backward()
    assert mode.largest >= n * v


def test_make_loss_fn_default_is_chunked():
    fn = make_loss_fn(use_liger=False, device_type="cpu")
    hidden, weight, targets = make_inputs()
    torch.testing.assert_close(
        fn(hidden, weight, targets), linear_cross_entropy_reference(hidden, weight, targets)
    )


def test_make_loss_fn_liger_needs_cuda():
    with pytest.raises(
        UserError, match=r"--use-liger-kernels needs a CUDA GPU; this run is on cpu"
    ):
        make_loss_fn(use_liger=True, device_type="cpu")


@pytest.mark.skipif(
    importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed"
)
def test_make_loss_fn_liger_missing_package():
    with pytest.raises(UserError, match=r"pip install 'mini-trainer\[cuda\]'"):
        make_loss_fn(use_liger=True, device_type="cuda")


def test_host_built_rows_give_the_identical_loss_and_gradients():
    # The collator hands the loss rows over (no device-side nonzero): same numbers, bit for bit.
    hidden, weight, targets = make_inputs(n=40, h=8, v=50, ignored=0.5)
    rows = torch.nonzero(targets != -100).flatten()
    results = []
    for given in (None, rows):
        h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        loss = chunked_linear_cross_entropy(h, w, targets, chunk_size=7, rows=given)
        loss.backward()
        results.append((loss, h.grad, w.grad))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)

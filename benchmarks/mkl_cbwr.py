"""MKL_CBWR (conditional numerical reproducibility): do misaligned inputs change a matmul's
bits, and what does strict mode cost? Run once per setting, e.g.
`for v in "" AUTO,STRICT; do MKL_CBWR=$v T=1 python benchmarks/mkl_cbwr.py; done`
(`T`: torch's threads). Prints the CPU model and the load (the machine may be shared; see
docs/benchmarks.md)."""

import os
import platform
import time

import torch

SHAPES = [(512, 64, 64), (512, 64, 281), (512, 281, 64), (1024, 64, 176), (2048, 176, 64),
          (300, 64, 64)]  # fmt: skip
"""(rows, inner, columns): the demo model's projections, its vocabulary, odd sizes."""


def misaligned(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `tensor` that starts `offset` floats into a fresh buffer (not 64-byte aligned)."""
    buffer = torch.empty(tensor.numel() + offset)
    view = buffer[offset:].view(tensor.shape)
    view.copy_(tensor)
    return view


def main() -> None:
    torch.set_num_threads(int(os.environ.get("T", "1")))
    torch.manual_seed(0)
    differing = total = 0
    for m, k, n in SHAPES:
        a, b, g = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        forward, backward = a @ b, a.t() @ g
        for offset in range(1, 16):
            x = misaligned(a, offset)
            differing += not torch.equal(x @ misaligned(b, offset), forward)
            differing += not torch.equal(x.t() @ g, backward)
            total += 2
    a, b = torch.randn(2048, 176), torch.randn(176, 64)
    started = time.perf_counter()
    for _ in range(200):
        a @ b
    elapsed = time.perf_counter() - started
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    cpu = names[0] if names else platform.processor()
    print(
        f"{cpu}; load {os.getloadavg()[0]:.1f}; MKL_CBWR={os.environ.get('MKL_CBWR')}: "
        f"misaligned results differing {differing}/{total}; 200 matmuls 2048x176x64 "
        f"{elapsed * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()

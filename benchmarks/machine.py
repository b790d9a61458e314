"""What a benchmark prints about the machine it ran on: the CPU, the load, the GEMM peak.

The machine is shared (other sessions' test suites and pipelines run beside a benchmark), so
every figure is printed with the load average before and after it, and with the machine's own
measured fp32 matrix-multiply peak at the benchmark's thread count: a tokens/s figure means
little without the fraction of that peak it reaches.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_line(threads: int) -> str:
    return (f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
            f"with {threads} thread(s)")  # fmt: skip


def load_line(when: str) -> str:
    return f"load average {when}: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)"


def gemm_peak_gflops(threads: int, size: int = 2048, repeats: int = 8) -> float:
    """The best fp32 GFLOP/s of a size x size matrix multiply with `threads` threads (the
    fastest of `repeats`, after one warm-up): what any training side can reach at most."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        return 2 * size**3 / best / 1e9
    finally:
        torch.set_num_threads(before)


def start_background_load(processes: int) -> list[subprocess.Popen]:
    """`processes` busy-looping Python processes: a stated load the benchmark makes itself."""
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(processes)]


def stop_background_load(started: list[subprocess.Popen]) -> None:
    for process in started:  # only the processes this benchmark started, by their handles
        process.kill()
        process.wait()

"""Weight interpolation (WiSE-FT) in the pipeline: which checkpoints it adds, and their names.

A method entry's `interpolation_alphas: [a, ...]` (percent steps in (0, 1)) adds, after every
stage of every learning rate, the checkpoint `(1 - a) * start + a * final` of that run
(`mini-trainer interpolate`, no training), evaluated on every task like a trained checkpoint.
Each alpha is a series of its own, named `<method>-wise<percent>` (`sft-wise50` for sft at 0.5),
so the report draws it beside the method: one more point per learning rate on the frontier.
The next stage still trains from the run's own final weights; an interpolated checkpoint is
scored, never trained from. Pure functions of the config, importing nothing else of the
pipeline (`layout` asks them).
"""

from __future__ import annotations

from typing import Any

WISE = "-wise"
"""Between the method's name and the alpha in percent: `sft-wise50`."""


def percent(alpha: float) -> int:
    return round(alpha * 100)


def interpolated_series(config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Series name -> (trained method, alpha in percent), in `methods:` order."""
    out = {}
    for method, spec in config["methods"].items():
        for alpha in spec.get("interpolation_alphas", []):
            out[f"{method}{WISE}{percent(alpha)}"] = (method, percent(alpha))
    return out


def interpolation_problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(config key, problem) of each bad `interpolation_alphas`."""
    problems = []
    for method, spec in config["methods"].items():
        alphas = spec.get("interpolation_alphas", [])
        key = f"config: methods.{method}.interpolation_alphas"
        for alpha in alphas:
            if not (0 < alpha < 1 and abs(alpha * 100 - percent(alpha)) < 1e-9):
                problems.append((key, f"{alpha!r} is not a multiple of 0.01 in (0, 1)"))
        if len({percent(a) for a in alphas}) != len(alphas):
            problems.append((key, "has the same alpha twice"))
    for name in interpolated_series(config):
        if name in config["methods"]:
            problems.append((f"config: methods.{name}", "is the name of an interpolated series"))
    return problems

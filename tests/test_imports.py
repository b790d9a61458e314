"""Imports run one way (issue 19 point 4), checked on the source with `ast` (no import runs).

- Packages import one way: each package (and each top-level module) has a rank in
  `PACKAGE_RANKS`, and imports only what ranks below it (docs/architecture.md draws the same
  layers). `training/` imports nothing from `plan/`, `evaluate/`, `report/`, `pipeline/` or
  `cli/`.
- No import cycle among the package's modules, counting the imports inside functions: a
  function-local import that only hides a cycle is a cycle; nor among the imports made for type
  hints only (`if TYPE_CHECKING:`).
- `distributed/` (process groups, launch, locks, preemption, Slurm) is below the rest: it
  imports nothing from `training/`, `osft/`, `evaluate/` or `models/`; and the runtime that
  `models/`, `osft/` and `evaluate/` use comes from `distributed/`, never from `training/`.
- An import inside a function is there to defer a heavy import (torch, transformers, ...) from
  a light path, or an optional one, and says so: `# deferred: <reason>` on its line or above
  its block.
- The light paths stay light: `mini-trainer --help`, `report`, `manifest` and the launcher's
  flag checks import neither torch nor transformers.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from helpers import REPO_ROOT, run_python

PACKAGE = REPO_ROOT / "mini_trainer"
DEFERRED = "# deferred:"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_nodes(
    tree: ast.Module, type_checking: bool = False
) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import statement, whether it runs inside a function), `if TYPE_CHECKING:` left out
    unless `type_checking`."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _type_checking_only(node) and not type_checking:
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, in_function))
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def imported_modules(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The package modules an import statement loads (`from pkg import mod` names `pkg.mod`)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level or node.module is None:
        raise AssertionError(f"relative import at line {node.lineno}: use absolute imports")
    out = set()
    for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if full in modules:
            out.add(full)
        elif node.module in modules:
            out.add(node.module)
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def import_graph(package: Path = PACKAGE, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside functions (and under
    `if TYPE_CHECKING:` with `type_checking`)."""
    modules = module_files(package)
    graph = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node, _ in import_nodes(parsed(path), type_checking):
            targets |= imported_modules(node, modules)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def undeferred_imports(package: Path = PACKAGE) -> list[str]:
    """`FILE:LINE: import` for each function-local import without a `# deferred:` reason on
    its line or above its block (blank lines and the block's other imports in between)."""
    problems = []
    for path in module_files(package).values():
        source = path.read_text()
        lines = source.splitlines()
        for node, in_function in import_nodes(parsed(path)):
            if not in_function or DEFERRED in lines[node.lineno - 1]:
                continue
            above = node.lineno - 2
            while above >= 0 and _import_block_line(lines[above]):
                above -= 1
            if above < 0 or not lines[above].strip().startswith(DEFERRED):
                where = path.relative_to(package.parent)
                problems.append(f"{where}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return problems


def _import_block_line(line: str) -> bool:
    text = line.strip()
    return not text or text.startswith(("from ", "import ", ")")) or text.endswith(",")


def test_no_import_cycle_among_the_package_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_through_the_type_hints_either():
    cycle = find_cycle(import_graph(type_checking=True))
    assert cycle is None, "import cycle (with TYPE_CHECKING imports): " + " -> ".join(cycle)


PACKAGE_RANKS = [
    # the leaves: errors, labels, file writes, versions, logging, the validation, optimizer and
    # async-save options' rules
    ("mini_trainer", "errors", "labels", "io_utils", "versions", "log_setup",
     "validation_options", "optimizer_options", "async_save_options"),
    ("methods",),  # each training method's option group, and the registry of methods by name
    ("launch_args", "training_args"),  # the flags, checked before any process starts
    ("distributed", "data", "batching"),  # processes; data files; packing into batches
    ("models", "method", "manifest", "demo"),  # model files; the method protocol; the manifest
    ("osft", "ewc"),  # the OSFT and EWC methods
    ("training",),  # the training loop and what it owns (the evaluator core, the memory probe)
    ("evaluate", "plan", "report", "pipeline"),  # the commands built on training, and the pipeline
    ("train", "api_train"),  # the worker's entry and the Python API
    ("cli",),
    ("__main__",),
]  # fmt: skip
"""Package (or top-level module) -> layer, lowest first: a name imports only lower layers."""


def rank_of(module: str) -> tuple[str, int]:
    """(package or top-level module, its layer) of a dotted module name."""
    name = module.split(".")[1] if "." in module else module
    ranks = {name: rank for rank, names in enumerate(PACKAGE_RANKS) for name in names}
    assert name in ranks, f"{module}: add {name!r} to PACKAGE_RANKS (tests/test_imports.py)"
    return name, ranks[name]


def upward_imports(graph: dict[str, set[str]]) -> set[str]:
    """`module -> target` for each import of a name of the same or a higher layer."""
    wrong = set()
    for module, targets in graph.items():
        name, rank = rank_of(module)
        for target in targets:
            target_name, target_rank = rank_of(target)
            if target_name != name and target_rank >= rank:
                wrong.add(f"{module} -> {target}")
    return wrong


def test_packages_import_one_way_by_the_rank_table():
    graph = import_graph(type_checking=True)
    assert not upward_imports(graph), sorted(upward_imports(graph))
    training = {
        target
        for module, targets in graph.items()
        if module.startswith("mini_trainer.training.")
        for target in targets
    }
    above = ("plan", "evaluate", "report", "pipeline", "cli")
    assert not {t for t in training if t.startswith(tuple(f"mini_trainer.{p}" for p in above))}


def test_distributed_holds_the_processes_and_imports_nothing_above_it():
    graph = import_graph()
    jobs = {"runtime", "launcher", "run_lock", "preemption", "slurm", "lifetime"}
    assert {f"mini_trainer.distributed.{name}" for name in jobs} <= set(graph)
    assert not {f"mini_trainer.training.{name}" for name in [*jobs, "distributed"]} & set(graph)
    above = ("training", "osft", "evaluate", "models")
    wrong = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("mini_trainer.distributed")
        for target in targets
        if target.startswith(tuple(f"mini_trainer.{package}." for package in above))
    }
    assert not wrong, sorted(wrong)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every package module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_options_the_launchers_and_the_report_reach_nothing_in_training():
    """Reading the training flags (Slurm launcher, pipeline checks) and building the report
    import no module of the training package, not even through another module."""
    graph = import_graph()
    starts = [
        "mini_trainer.training_args",
        "mini_trainer.launch_args",
        "mini_trainer.validation_options",
    ]
    starts += [
        m for m in graph if m.startswith(("mini_trainer.distributed.", "mini_trainer.report."))
    ]
    wrong = {
        f"{start} -> {target}"
        for start in starts
        for target in reachable(graph, start)
        if target.startswith("mini_trainer.training.")
    }
    assert not wrong, sorted(wrong)


def test_models_osft_and_methods_import_nothing_from_training():
    """They are below the training loop; evaluation takes the runtime from `distributed/`."""
    graph = import_graph()
    lower = [m for m in graph if m.startswith(("mini_trainer.models.", "mini_trainer.osft."))]
    wrong = {
        f"{module} -> {target}"
        for module in [*lower, "mini_trainer.method"]
        for target in graph.get(module, ())
        if target.startswith("mini_trainer.training.")
    }
    assert lower and not wrong, sorted(wrong)
    assert "mini_trainer.method" in graph  # the method protocol, outside training/
    evaluation = set().union(*(graph[m] for m in graph if m.startswith("mini_trainer.evaluate")))
    assert "mini_trainer.distributed.runtime" in evaluation


def test_every_function_local_import_says_why_it_is_deferred():
    problems = undeferred_imports()
    assert not problems, "\n".join(problems)


def callers(name: str, package: Path = PACKAGE) -> set[str]:
    """`module.function` of every function of the package that calls `name(...)`."""
    found = set()
    for module, path in module_files(package).items():
        for function in ast.walk(parsed(path)):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                isinstance(call, ast.Call) and ast.unparse(call.func) == name
                for call in ast.walk(function)
            ):
                found.add(f"{module}.{function.name}")
    return found


def test_one_launch_path():
    """`train --nproc-per-node` and `launch` both run `train.launch`, the only caller of the
    agent (`run_training` runs `mini-trainer train`); the worker command is built once."""
    assert callers("launch_training") == {
        "mini_trainer.cli.training.train",
        "mini_trainer.cli.training.launch",
    }
    assert callers("supervise") == {"mini_trainer.train.launch"}
    assert callers("elastic_launch") == {"mini_trainer.distributed.launcher.supervise"}
    assert callers("worker_argv") == {
        "mini_trainer.distributed.launcher.supervise",
        "mini_trainer.distributed.launcher.torchrun_command",
    }


def test_the_checks_find_what_they_look_for(tmp_path):
    """A cycle hidden in a function and an unexplained local import are found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text(
        "def f():\n    from pkg.a import g  # hides a cycle\n\n\n"
        "def h():\n    # deferred: torch\n    import torch\n\n    from pkg import a\n"
    )
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.b", "pkg.a"]
    assert undeferred_imports(package) == ["pkg/b.py:2: from pkg.a import g  # hides a cycle"]
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.d import T\n"
    )
    (package / "d.py").write_text("from pkg.c import U\n")
    assert import_graph(package)["pkg.c"] == set()  # a type-only import is left out, unless asked
    typed = import_graph(package, type_checking=True)
    assert find_cycle({m: typed[m] for m in ("pkg.c", "pkg.d")}) == ["pkg.c", "pkg.d", "pkg.c"]
    assert upward_imports({"mini_trainer.training.loop": {"mini_trainer.plan.memory"}}) == {
        "mini_trainer.training.loop -> mini_trainer.plan.memory"
    }
    assert not upward_imports({"mini_trainer.plan.memory": {"mini_trainer.training.loop"}})


def test_light_commands_import_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "import mini_trainer.cli, mini_trainer.train, mini_trainer.report.build\n"
        "import mini_trainer.manifest, mini_trainer.distributed.launcher\n"
        "import mini_trainer.distributed.slurm, mini_trainer.api_train\n"
        "heavy = sorted({'torch', 'transformers', 'huggingface_hub'} & set(sys.modules))\n"
        "print(heavy)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

"""docs/architecture.md stays true to the tree: every file its recipes list exists, every module of
`training/` and `models/` has its line, and every document the code cites is in the repository."""

from __future__ import annotations

import re

from helpers import REPO_ROOT

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`([\w./-]+/[\w.-]+/?|[\w-]+\.(?:py|md|smk|yaml)|Snakefile)`")
"""A backticked path: with a folder, or a bare file name with a known suffix."""


def section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def recipe_paths(text: str) -> set[str]:
    """The repository paths in backticks (`<placeholders>` and globs left out)."""
    return {
        path.rstrip("/")
        for path in PATH.findall(text)
        if "/" in path or path in {"Snakefile", "README.md"}
    }


def test_every_file_a_recipe_lists_exists():
    paths = recipe_paths(section("Recipes"))
    assert {"mini_trainer/pipeline/__init__.py", "workflow/schemas/config.schema.yaml"} <= paths
    missing = sorted(path for path in paths if not (REPO_ROOT / path).exists())
    assert not missing, f"docs/architecture.md lists files that do not exist: {missing}"


def test_the_path_finder_sees_paths_and_only_paths():
    text = "`a/b.py`, `mini_trainer/cli/`, `resources.<rule>`, `rule_resource`, `Snakefile`"
    assert recipe_paths(text) == {"a/b.py", "mini_trainer/cli", "Snakefile"}


def test_every_module_of_training_and_models_has_its_line():
    text = section("Layers")
    for package in ("training", "models"):
        for path in sorted((REPO_ROOT / "mini_trainer" / package).glob("*.py")):
            if path.name != "__init__.py":
                assert f"| `{path.name}` |" in text, f"docs/architecture.md: no line for {path}"


NAMED_NOT_CITED = {
    (test, "DESIGN.md") for test in ("tests/test_docs.py", "tests/test_architecture.py")
}
"""Names that are no citation: test_docs.py lists it as what no document may point to."""


def test_every_document_the_code_cites_exists():
    """Each markdown file named in the package, the tests or the benchmarks exists."""
    cited = re.compile(r"(?<![\w/.-])((?:docs/|config/)?[A-Za-z][\w-]*\.md)\b")
    missing = set()
    for folder in ("mini_trainer", "tests", "benchmarks"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for name in cited.findall(path.read_text()):
                where = REPO_ROOT / name if "/" in name else REPO_ROOT / "docs" / name
                named = (str(path.relative_to(REPO_ROOT)), name) in NAMED_NOT_CITED
                if not named and not where.exists() and not (REPO_ROOT / name).exists():
                    missing.add(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert not missing, sorted(missing)

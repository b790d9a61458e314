"""The README and docs/ as a newcomer meets them: every command block names commands, flags and
files that exist; every link stays inside the repository; stated counts match what is collected;
every time or count the README states is in docs/benchmarks.md's table of measured figures.

Running every block is too slow for the suite (the demo alone is minutes): each shell block says
first what it needs (`# needs:`) or that it is a synopsis (`# synopsis:`), and the blocks are parsed
and checked against the real CLI objects (click's commands, the training job's argparse parser)
and the files they name. `docs_commands()` is also used by the pipeline's dry-run test, which
checks that no block writes into what the Set-up command's pipeline has already built.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
from helpers import REPO_ROOT, WHOLE_SUITE_COUNT, subprocess_env

DOC_FILES = sorted(
    [REPO_ROOT / "README.md", REPO_ROOT / "config" / "README.md", *REPO_ROOT.glob("docs/*.md")]
)
SHELL_LANGS = ("bash", "sh", "shell", "console")
OUTPUT_FLAGS = ("--out", "--output-dir", "--out-index", "--out-summary", "--out-train",
                "--out-validation", "--out-sidecar")  # fmt: skip
"""Flags whose value a command creates (and refuses to replace without --force)."""


@dataclass(frozen=True)
class Command:
    """One command of a shell block: where it is and its words (comments, brackets of optional
    parts and `\\` continuations removed)."""

    where: str
    words: tuple[str, ...]


def fenced_blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line of the opening fence, body lines) of every fenced block of `path`."""
    blocks, inside = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            if inside is None:
                inside = (line.strip()[3:].strip(), number, [])
            else:
                blocks.append(inside)
                inside = None
        elif inside is not None:
            inside[2].append(line)
    assert inside is None, f"{path}:{inside[1]}: a code fence is never closed"
    return blocks


def docs_commands() -> list[Command]:
    """Every command of every shell block of README.md, config/README.md and docs/*.md, and
    every mini-trainer command of their plain blocks (usage lines beside printed output)."""
    commands = []
    for path in DOC_FILES:
        for lang, start, body in fenced_blocks(path):
            if lang not in (*SHELL_LANGS, ""):
                continue
            text = "\n".join(body).replace("\\\n", " ")
            for offset, line in enumerate(text.splitlines(), 1):
                quoted = re.sub(r"<([^<>]*)>", r"'<\1>'", line)  # <placeholder words>
                try:
                    words = shlex.split(quoted, comments=True)
                except ValueError:  # printed output with an apostrophe, not a command
                    assert not lang, f"{path}:{start + offset}: {error_of(quoted)}"
                    continue
                for part in _split_on(words, ("&&", "||", ";", "|")):
                    words = tuple(_unbracket(w) for w in part if w not in ("[", "]"))
                    if words and (lang or mini_trainer_call(words) is not None):
                        where = f"{path.relative_to(REPO_ROOT)}:{start + offset}"
                        commands.append(Command(where, words))
    return commands + readme_table_commands()


def readme_table_commands() -> list[Command]:
    """The synopsis in the first cell of each row of README's command table."""
    commands = []
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if match := re.match(r"\| `([a-z][a-z-]+ [^`]*|[a-z][a-z-]+)` \|", line):
            synopsis = match.group(1).replace("\\|", "|")
            words = [_unbracket(w) for w in shlex.split(synopsis) if w not in ("[", "]")]
            commands.append(Command(f"README.md:{number}", ("mini-trainer", *words)))
    assert len(commands) >= 10, "README's command table was not found"
    return commands


def error_of(line: str) -> str:
    try:
        shlex.split(line)
    except ValueError as error:
        return str(error)
    return ""


def _unbracket(word: str) -> str:
    """`[--force]` -> `--force` (an optional part of a usage line); `.[test]` stays."""
    if word.count("[") != word.count("]"):
        return word.lstrip("[").rstrip("]")
    if word.startswith("[") and word.endswith("]"):
        return word[1:-1]
    return word


def _split_on(words: list[str], separators: tuple[str, ...]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word in separators:
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def mini_trainer_call(words: tuple[str, ...]) -> list[str] | None:
    """The subcommand and its arguments when `words` runs mini-trainer (the script, `python -m
    mini_trainer`, or torchrun of either or of `mini_trainer.train`); else None."""
    words = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # VAR=value prefixes
    if not words:
        return None
    if Path(words[0]).name == "mini-trainer":
        return words[1:]
    if "-m" in words and Path(words[0]).name in ("python", "python3", "torchrun"):
        module = words[words.index("-m") + 1]
        rest = words[words.index("-m") + 2 :]
        if module == "mini_trainer":
            return rest
        if module == "mini_trainer.train":
            return ["train", *rest]
    return None


def known_flags(subcommand: str) -> set[str] | None:
    """The flags a subcommand takes, from the real CLI objects; None: no such subcommand."""
    from mini_trainer.cli import cli
    from mini_trainer.launch_args import LAUNCHER_FLAGS
    from mini_trainer.training_args import build_parser

    if subcommand == "train":  # click passes its flags through to the job's argparse parser
        parser_flags = {s for a in build_parser()._actions for s in a.option_strings}
        return parser_flags | set(LAUNCHER_FLAGS)
    command = cli.commands.get(subcommand)
    if command is None:
        return None
    flags = {name for param in command.params for name in param.opts + param.secondary_opts}
    if any(param.type is click.UNPROCESSED for param in command.params):  # takes train's flags
        flags |= known_flags("train")
    return flags | {"--help"}


def flags_of(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and w != "--"]


def check_mini_trainer(call: list[str]) -> list[str]:
    """What is wrong with one mini-trainer call: an unknown subcommand or flag."""
    if not call or call[0].startswith("-"):
        known = {"--help", "--version"}
        return [
            f"{flag}: not an option of mini-trainer" for flag in flags_of(call) if flag not in known
        ]
    subcommand, args = call[0], call[1:]
    flags = known_flags(subcommand)
    if flags is None:
        return [f"{subcommand}: no such subcommand of mini-trainer"]
    train_args: list[str] = []
    if subcommand == "launch" and "--" in args:  # launch's own flags, then the training job's
        args, train_args = args[: args.index("--")], args[args.index("--") + 1 :]
    problems = [
        f"{subcommand} {flag}: no such flag" for flag in flags_of(args) if flag not in flags
    ]
    train_flags = known_flags("train")
    problems += [f"train {flag}: no such flag" for flag in flags_of(train_args)
                 if flag not in train_flags]  # fmt: skip
    return problems


def check_script(words: tuple[str, ...]) -> list[str]:
    """A repository script (`python benchmarks/x.py`, `benchmarks/x.sh`, `scripts/...`) exists
    and names every flag the block gives it; files given to snakemake exist."""
    words = list(words)
    if Path(words[0]).name in ("python", "python3") and len(words) > 1:
        words = words[1:]
    script = words[0]
    if script.startswith(("benchmarks/", "scripts/")):
        path = REPO_ROOT / script
        if not path.is_file():
            return [f"{script}: no such file in the repository"]
        text = path.read_text(encoding="utf-8")
        return [f"{script} {flag}: the script never names this flag"
                for flag in flags_of(words[1:]) if flag not in text]  # fmt: skip
    if Path(script).name == "snakemake":
        problems = []
        for flag in ("--configfile", "--profile"):
            if flag in words and not (REPO_ROOT / words[words.index(flag) + 1]).exists():
                problems.append(f"snakemake {flag} {words[words.index(flag) + 1]}: no such file")
        return problems
    return []


def test_every_command_block_names_real_commands_flags_and_files():
    commands = docs_commands()
    assert len(commands) > 20  # the blocks were found and parsed
    problems, calls = [], 0
    for command in commands:
        call = mini_trainer_call(command.words)
        found = check_mini_trainer(call) if call is not None else check_script(command.words)
        calls += call is not None
        problems += [f"{command.where}: {problem}" for problem in found]
    assert calls > 15
    assert not problems, "\n".join(problems)


def test_the_command_check_finds_a_wrong_flag_or_subcommand():
    """The checks above can fail: a renamed flag, an unknown subcommand, a missing script."""
    assert check_mini_trainer(["evaluate", "--model", "m", "--output", "x"]) == [
        "evaluate --output: no such flag"
    ]
    assert check_mini_trainer(["evaluat"]) == ["evaluat: no such subcommand of mini-trainer"]
    assert check_mini_trainer(["train", "--learning-rate", "1", "--lr", "2"]) == [
        "train --lr: no such flag"
    ]
    assert check_mini_trainer(["launch", "--nproc-per-node", "2", "--", "--max-step", "3"]) == [
        "train --max-step: no such flag"
    ]
    assert check_script(("python", "benchmarks/peers.py", "--modelz", "demo")) == [
        "benchmarks/peers.py --modelz: the script never names this flag"
    ]
    assert check_script(("python", "benchmarks/nothing.py")) == [
        "benchmarks/nothing.py: no such file in the repository"
    ]
    assert mini_trainer_call(("torchrun", "--nproc-per-node", "2", "-m", "mini_trainer.train",
                              "--max-steps", "3")) == ["train", "--max-steps", "3"]  # fmt: skip


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_links_and_file_pointers_stay_inside_the_repository():
    """Every relative link resolves to a file or folder of the repository, and no page points
    readers to a design file or folder outside it."""
    problems = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for match in LINK.finditer(text):
            target = match.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z]+:", target):  # an anchor, or http(s)/mailto
                continue
            resolved = (path.parent / target).resolve()
            line = text[: match.start()].count("\n") + 1
            if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
                problems.append(
                    f"{path.relative_to(REPO_ROOT)}:{line}: {target}: not in the repository"
                )
        for outside in ("DESIGN.md", "../shared", "/work/"):
            if outside in text:
                line = text[: text.index(outside)].count("\n") + 1
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line}: names {outside}")
    assert not problems, "\n".join(problems)


def test_readme_tables_have_no_blank_line_inside():
    """A blank line inside a Markdown table ends it: the rows after it render as text."""
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    for i in range(1, len(lines) - 1):
        if not lines[i].strip():
            assert not (lines[i - 1].startswith("|") and lines[i + 1].startswith("|")), (
                f"README.md:{i + 1}: a blank line splits a table"
            )


def stated_counts(noun: str, paths=("README.md",)) -> list[tuple[str, int]]:
    """(file:line, N) of every "N <noun>" the given pages state."""
    found = []
    for name in paths:
        text = (REPO_ROOT / name).read_text(encoding="utf-8")
        for match in re.finditer(rf"\b(\d[\d,]*) {noun}\b", text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{name}:{line}", int(match.group(1).replace(",", ""))))
    return found


def test_the_stated_test_count_is_what_pytest_collects(request):
    """README's "N tests" is the suite as collected now (`pytest --collect-only -q`): this
    session's own count when it collected the whole suite (conftest.py), else a child's."""
    collected = request.config.stash.get(WHOLE_SUITE_COUNT, None)
    if collected is None:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
            capture_output=True, text=True, cwd=REPO_ROOT, env=subprocess_env(), timeout=600,
        )  # fmt: skip
        match = re.search(r"^(\d+) tests? collected", result.stdout, re.MULTILINE)
        assert match, result.stdout[-2000:] + result.stderr[-2000:]
        collected = int(match.group(1))
    stated = stated_counts("tests")
    assert stated, "README.md states no test count"
    wrong = [f"{where}: states {n} tests" for where, n in stated if n != collected]
    assert not wrong, f"{wrong}; pytest collects {collected}: update the README"


FIGURE = re.compile(
    r"(?<![\w.-])(?:about |under )?\d[\d,.]*(?:-\d[\d,.]*)?"
    r" (?:min \d+ s|min(?:utes?)?|s|seconds|jobs|tests|MB|GB)(?![\w-])"
)
"""A time or count in prose: `9 min 14 s`, `about 4.5 minutes`, `15-45 s`, `45 jobs`."""


def figures(text: str) -> list[str]:
    """The figures of `text` outside code (fenced blocks and `code spans`), normalized: one
    space, `minutes` as `min`, no `about`/`under`."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    prose = re.sub(r"\s+", " ", prose)
    found = []
    for match in FIGURE.finditer(prose):
        figure = re.sub(r"^(about|under) ", "", match.group(0))
        found.append(re.sub(r" min(utes?)?\b", " min", figure))
    return found


def test_every_figure_the_readme_states_is_in_the_benchmarks_table():
    """Each time or count of README's prose appears in docs/benchmarks.md's "Figures the README
    states" table, whose rows carry the measurement's date and machine: a figure that is
    changed in one place only, or added without a measurement, fails here."""
    text = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = text.split("## Figures the README states", 1)[1].split("\n## ", 1)[0]
    recorded = set(figures(table))
    stated = figures((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(stated) >= 8, stated  # the README's figures were found
    missing = sorted(set(stated) - recorded)
    assert not missing, f"README figures not in docs/benchmarks.md's table: {missing}"


def test_the_figure_check_finds_figures_and_ignores_code():
    text = "took 9 min 14 s, about 4.5 minutes; 15-45 s; 45 jobs `--max-steps 3 s`\n```\n3 s\n```"
    assert figures(text) == ["9 min 14 s", "4.5 min", "15-45 s", "45 jobs"]


def test_every_shell_block_says_what_it_needs_first():
    """A newcomer runs a block as written on a fresh clone after the Set-up command, or is told
    first what it needs: its first line is `# needs: ...` (what must exist or run before it) or
    `# synopsis: ...` (a usage line whose placeholders are the reader's)."""
    unsaid = [
        f"{path.relative_to(REPO_ROOT)}:{start}"
        for path in DOC_FILES
        for lang, start, body in fenced_blocks(path)
        if lang in SHELL_LANGS and not (body and body[0].startswith(("# needs: ", "# synopsis: ")))
    ]
    assert not unsaid, f"shell blocks that do not begin with '# needs:' or '# synopsis:': {unsaid}"


def test_ci_runs_the_readme_test_command_not_its_comment():
    """`.ci/run` takes the README's test command from the block after the ci-test-command
    marker: its pytest line, not the block's `# needs:` comment (a comment run as the command
    would pass without running a test)."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- ci-test-command -->", 1)[1].split("```", 2)[1]
    (command,) = [line for line in block.splitlines()[1:] if line and not line.startswith("#")]
    printed = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "run"), "--print-command"],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert printed.stdout.strip() == command and "pytest" in command

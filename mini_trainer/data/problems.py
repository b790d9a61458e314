"""Collecting per-line problems in constant memory and reporting them as one `UserError`.

A file with a million bad lines must not print a million lines nor hold them: the first
`MAX_SHOWN` problems are kept verbatim, the rest only counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mini_trainer.errors import UserError

MAX_SHOWN = 50


@dataclass
class ProblemLog:
    """Problems of one input file, each reported as `FILE:LINE: FIELD: reason`."""

    file: str
    """The name printed before every problem (the path as the user gave it)."""
    max_shown: int = MAX_SHOWN
    """How many problems are kept for printing; the rest are only counted."""
    count: int = 0
    """Problems found so far."""
    shown: list[str] = field(default_factory=list)
    """The first `max_shown` problems, formatted."""

    def add(self, line: int, field_name: str, reason: str) -> None:
        self.count += 1
        if len(self.shown) < self.max_shown:
            self.shown.append(f"{self.file}:{line}: {field_name}: {reason}")

    def add_file_problem(self, reason: str) -> None:
        """A problem of the whole file (no line to point at), such as an empty file."""
        self.count += 1
        if len(self.shown) < self.max_shown:
            self.shown.append(f"{self.file}: {reason}")

    def raise_if_any(self, nothing_written: str | None = "nothing written", hints=()) -> None:
        """Raise a `UserError` listing the problems, their total and `hints`, if any.

        `nothing_written` None is for commands whose output is not the checked file's product
        (evaluate, train): one problem is then its one line, with no total after it.
        """
        if not self.count:
            return
        if nothing_written is None and self.count == 1 and self.shown:
            raise UserError(*self.shown, *hints)
        total = f"{self.file}: {self.count} problem{'s' if self.count != 1 else ''}"
        if self.count > len(self.shown):
            total += f" (first {len(self.shown)} shown)"
        if nothing_written is not None:
            total += f"; {nothing_written}"
        raise UserError(*self.shown, total, *hints)

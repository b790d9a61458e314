"""The one exception type that the CLI turns into a clear message and a non-zero exit, and the
walk through an error's chain that finds what lies behind a failure."""

from __future__ import annotations

from collections.abc import Iterator


class UserError(Exception):
    """A problem with the user's input, reported as one line per problem on stderr.

    `lines` holds the messages (for example `FILE:LINE: FIELD: reason`); the CLI prints them and
    exits with `exit_code`, without a traceback.
    """

    def __init__(self, *lines: str, exit_code: int = 2):
        super().__init__("\n".join(lines))
        self.lines = list(lines)
        self.exit_code = exit_code


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what lies behind it (causes, contexts, and each rank's failure of a DCP
    `CheckpointException`), depth first, each once: where a lost peer or a full disk is found."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> error
        if isinstance(failures, dict):
            for failure in failures.values():  # (exception, traceback) pairs
                first = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(first, BaseException):
                    todo.append(first)

"""Continual-learning metrics from an accuracy matrix: pure functions, no files, no plots.

The matrix of one (method, learning rate): `matrix[s][j]` is the accuracy on task j (0-based, in
stage order) after stage s, where stage 0 is the base model and stage s >= 1 is the model after
training on task s-1. A missing evaluation is `None`, and every metric that needs a missing cell
is `None` too: a report shows it as missing, never as a number made up from the other cells.

With T the last stage (tasks 0..T-1 seen), as in the OSFT paper (arXiv:2504.07097):
- average accuracy AA = mean over j < T of matrix[T][j];
- backward transfer BWT = mean over j < T-1 of (matrix[T][j] - matrix[j+1][j]): how much each
  earlier task's accuracy changed since just after it was learned (negative = forgetting);
- the frontier point = (matrix[T][T-1], mean over j < T-1 of matrix[T][j]): accuracy on the
  newest task (plasticity) against retained accuracy on the earlier ones (stability).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Cell = float | None
Matrix = Sequence[Sequence[Cell]]


def _last_stage(matrix: Matrix, stage: int | None) -> int:
    last = len(matrix) - 1 if stage is None else stage
    if not 0 <= last < len(matrix):
        raise ValueError(f"stage {last} is not a row of a {len(matrix)}-row matrix")
    if last > len(matrix[last]):
        raise ValueError(f"stage {last} needs {last} task columns, the row has {len(matrix[last])}")
    return last


def _mean(values: Iterable[Cell]) -> float | None:
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def average_accuracy(matrix: Matrix, stage: int | None = None) -> float | None:
    """AA after `stage` (default: the last row): mean accuracy over the tasks seen so far."""
    last = _last_stage(matrix, stage)
    return _mean(matrix[last][:last]) if last >= 1 else None


def backward_transfer(matrix: Matrix, stage: int | None = None) -> float | None:
    """BWT after `stage`: mean over earlier tasks of (accuracy now - accuracy when learned).

    Needs at least two stages; None with one (no earlier task) or when a cell is missing.
    """
    last = _last_stage(matrix, stage)
    if last < 2:
        return None
    changes = []
    for j in range(last - 1):
        now, learned = matrix[last][j], matrix[j + 1][j]
        changes.append(None if now is None or learned is None else now - learned)
    return _mean(changes)


def frontier_point(matrix: Matrix, stage: int | None = None) -> tuple[float, float] | None:
    """(accuracy on the newest task, mean retained accuracy on the earlier ones) after `stage`."""
    last = _last_stage(matrix, stage)
    if last < 2:
        return None
    newest, retained = matrix[last][last - 1], _mean(matrix[last][: last - 1])
    if newest is None or retained is None:
        return None
    return newest, retained


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (higher is better)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (ox >= x and oy >= y) and (ox > x or oy > y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def build_matrix(
    num_tasks: int, last_stage: int, cells: dict[tuple[int, int], Cell]
) -> list[list[Cell]]:
    """Rows 0..last_stage, `num_tasks` columns, from `{(stage, task index): accuracy}`."""
    return [[cells.get((s, j)) for j in range(num_tasks)] for s in range(last_stage + 1)]

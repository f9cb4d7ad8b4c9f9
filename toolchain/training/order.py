"""Which data row each training step uses: one rule for the eager and the program trainers.

File order, cycling; with a seed, a fresh permutation per pass over the data ("epoch"):
`toolchain.text.shuffle.permutation(rows, seed + epoch)` (SplitMix64 + Fisher-Yates). The row of a step is
a function of the step alone, so a resumed run sees the rows an uninterrupted one would, `--steps` can
be extended on resume (the order of the first steps does not depend on the total), and nothing is
allocated per step in advance. The apps' trainer cores (android/trainer-core DataOrder.kt, ios/TrainerCore Data.swift)
compute the same permutations, so a seeded run visits the same rows on the host and on a phone.
"""

from __future__ import annotations

from toolchain.errors import BadInput
from toolchain.text.shuffle import permutation

__all__ = ["DataOrder", "data_order"]


class DataOrder:
    """`order[step]` is the row index of `step` (0-based, counted over the whole run).

    Args:
        rows: number of training rows (>= 1).
        shuffle_seed: None keeps file order; else the seed of the per-pass permutations.

    Raises:
        BadInput: no rows.
    """

    def __init__(self, rows: int, shuffle_seed: int | None = None) -> None:
        if rows < 1:
            raise BadInput("no training rows: the data has no example to train on")
        self.rows, self.shuffle_seed = rows, shuffle_seed
        self._epoch, self._perm = -1, []

    def __getitem__(self, step: int) -> int:
        if step < 0:
            raise IndexError(step)
        if self.shuffle_seed is None:
            return step % self.rows
        epoch = step // self.rows
        if epoch != self._epoch:  # one permutation alive at a time
            self._epoch, self._perm = epoch, permutation(self.rows, self.shuffle_seed + epoch)
        return self._perm[step % self.rows]


def data_order(rows: int, steps: int, *, shuffle_seed: int | None = None) -> list[int]:
    """The rows of the first `steps` steps (`DataOrder` as a list)."""
    order = DataOrder(rows, shuffle_seed)
    return [order[s] for s in range(steps)]

"""Seeded permutations that the host and the phones compute identically (row order, held-out split).

One generator, SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014), and one shuffle, Fisher-Yates from the top, so that `train --shuffle S` on the host,
the Kotlin trainer core and the Swift one visit the same rows, and `toolchain data --held-out` and
the apps' on-device split hold out the same rows. All arithmetic is modulo 2**64:

    next():  state += 0x9E3779B97F4A7C15
             z = state
             z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
             return z ^ (z >> 31)

    permutation(n, seed):  p = [0, 1, ..., n-1]; state = seed mod 2**64
                           for i = n-1 down to 1: j = next() mod (i + 1); swap p[i], p[j]

The reference values the apps test against are in `shared_schemas/data_corpus/` (written by
`scripts/record_data_corpus.py`). `j` has a modulo bias of at most n / 2**64, which is nothing
for row counts.
"""

from __future__ import annotations

__all__ = ["SplitMix64", "permutation"]

_MASK = (1 << 64) - 1


class SplitMix64:
    """The generator above; `seed` is taken modulo 2**64 (so -1 is 2**64 - 1, as on the phones)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)


def permutation(n: int, seed: int) -> list[int]:
    """A permutation of range(n), a function of (n, seed) alone (see the module docstring)."""
    p = list(range(n))
    rng = SplitMix64(seed)
    for i in range(n - 1, 0, -1):
        j = rng.next() % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p

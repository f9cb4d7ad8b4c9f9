"""The one row order (toolchain/training/order.py): file order cycling, or a seeded permutation per
pass that depends on the step alone (so resuming and extending --steps continue the same sequence)."""

from __future__ import annotations

import pytest

from toolchain.errors import BadInput
from toolchain.text.shuffle import SplitMix64, permutation
from toolchain.training import DataOrder, data_order


def test_splitmix64_matches_the_published_reference_outputs():
    # Vigna's splitmix64.c seeded with 1234567 (the values every port checks against)
    rng = SplitMix64(1234567)
    assert [rng.next() for _ in range(5)] == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                              4593380528125082431, 16408922859458223821]
    assert SplitMix64(-1).state == 2**64 - 1


def test_permutation_is_fisher_yates_over_splitmix64():
    rng = SplitMix64(42)
    expected = list(range(9))
    for i in range(8, 0, -1):  # the documented shuffle, written out
        j = rng.next() % (i + 1)
        expected[i], expected[j] = expected[j], expected[i]
    assert permutation(9, 42) == expected
    assert sorted(permutation(50, 3)) == list(range(50)) and permutation(50, 3) != list(range(50))
    assert permutation(1, 5) == [0] and permutation(0, 5) == []


def test_file_order_cycles():
    assert data_order(3, 7) == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("rows, seed", [(1, 0), (5, 4), (7, -3), (2, 2**40)])
def test_shuffle_is_a_permutation_per_pass_seeded_by_seed_plus_pass(rows, seed):
    order = data_order(rows, 3 * rows + 1, shuffle_seed=seed)
    for p in range(3):
        expected = permutation(rows, seed + p)
        assert order[p * rows:(p + 1) * rows] == expected
    assert order == data_order(rows, 3 * rows + 1, shuffle_seed=seed)


def test_row_of_a_step_does_not_depend_on_the_run_length_or_the_access_order():
    long = data_order(5, 40, shuffle_seed=9)
    assert data_order(5, 12, shuffle_seed=9) == long[:12]
    order = DataOrder(5, 9)
    assert [order[s] for s in (33, 2, 17, 2, 39)] == [long[s] for s in (33, 2, 17, 2, 39)]
    assert data_order(5, 12, shuffle_seed=9) != data_order(5, 12, shuffle_seed=10)


def test_no_rows_is_an_error_not_an_endless_loop():
    with pytest.raises(BadInput, match="no training rows"):
        DataOrder(0, None)
    with pytest.raises(BadInput, match="no training rows"):
        data_order(0, 5, shuffle_seed=1)

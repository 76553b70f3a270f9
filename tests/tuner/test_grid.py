"""The batch sizes a profile covers (tabletune.tuner.grid)."""

from __future__ import annotations

import pytest

from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.tuner.grid import default_grid, parse_grid, table_with_every_length


def test_default_grid_every_b_to_16_then_4_then_8():
    grid = default_grid(100)
    assert grid[:16] == tuple(range(1, 17))
    assert grid[16:28] == tuple(range(20, 65, 4))
    assert grid[28:] == (72, 80, 88, 96, 100)
    assert default_grid(8) == tuple(range(1, 9))


def test_parse_grid_and_its_errors():
    assert parse_grid("1-4,8,16-32:8") == (1, 2, 3, 4, 8, 16, 24, 32)
    with pytest.raises(ValueError, match=r"batch_sizes: 'x' is not"):
        parse_grid("1,x")
    with pytest.raises(ValueError, match="batch_sizes"):
        parse_grid("0")


def test_table_with_every_length_is_valid_and_complete():
    table = table_with_every_length(3, 64)
    assert table == [[1, 1, 0], [2, 2, 1], [3, 3, 2], [4, 64, 3]]
    assert {k for _, _, k in table_with_every_length(2, 2)} == {0, 1, 2}


def test_a_range_past_the_largest_batch_size_is_refused_before_it_is_expanded():
    """Expanded, '1-1000000000' is a set of a billion ints: the memory gone before the
    --max-batch-size filter could look at it."""
    with pytest.raises(ValueError, match=rf"'1-1000000000' goes above {MAX_BATCH_SIZE}"):
        parse_grid("1-1000000000")
    with pytest.raises(ValueError, match="the step must be >= 1"):
        parse_grid("1-8:0")
    assert parse_grid(f"{MAX_BATCH_SIZE - 1}-{MAX_BATCH_SIZE}") == (MAX_BATCH_SIZE - 1,
                                                                   MAX_BATCH_SIZE)

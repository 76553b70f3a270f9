"""What a profile covers: the batch sizes it times (the default grid, or one parsed from the
CLI's text) and a vLLM table in which every length 0..K appears, so one server can serve each
length when it is pinned."""

from __future__ import annotations

from tabletune.core.builder import MAX_BATCH_SIZE


def default_grid(max_batch_size: int) -> tuple[int, ...]:
    """Every B to 16, then every 4 to 64, then every 8 to the maximum."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size: {max_batch_size!r} must be >= 1")
    grid = list(range(1, min(16, max_batch_size) + 1))
    grid += list(range(20, min(64, max_batch_size) + 1, 4))
    grid += list(range(72, max_batch_size + 1, 8))
    if grid[-1] != max_batch_size:
        grid.append(max_batch_size)
    return tuple(grid)


def parse_grid(text: str) -> tuple[int, ...]:
    """``"1-16,20-64:4,72-256:8"`` or ``"1,2,4,8"`` → sorted unique batch sizes."""
    sizes: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                span, _, step = part.partition(":")
                lo, hi = (int(x) for x in span.split("-", 1))
                stride = int(step) if step else 1
            else:
                lo = hi = int(part)
                stride = 1
        except ValueError:
            raise ValueError(f"batch_sizes: {part!r} is not N, A-B or A-B:STEP") from None
        if hi > MAX_BATCH_SIZE:  # refused before a range of a billion sizes fills the memory
            raise ValueError(f"batch_sizes: {part!r} goes above {MAX_BATCH_SIZE}, the largest "
                             f"batch size allowed")
        if stride < 1:
            raise ValueError(f"batch_sizes: {part!r}: the step must be >= 1")
        sizes.update(range(lo, hi + 1, stride))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes: {text!r} must name batch sizes >= 1")
    return tuple(sorted(sizes))


def table_with_every_length(max_k: int, max_batch_size: int) -> list[list[int]]:
    """A valid table in which each length 0..max_k appears (k = max_k for the tail)."""
    ranges = [[b + 1, b + 1, b] for b in range(max_k)]
    ranges.append([max_k + 1, max(max_k + 1, max_batch_size), max_k])
    return ranges

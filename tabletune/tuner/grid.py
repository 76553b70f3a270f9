"""What a profile covers: the batch sizes it times (the default grid, or one parsed from the
CLI's text) and a vLLM table in which every length 0..K appears, so one server can serve each
length when it is pinned."""

from __future__ import annotations

from tabletune.core.builder import MAX_BATCH_SIZE


# The batch sizes a GPU tune profiles by default: the grid of the H100 tunes whose tables held
# in load tests against fixed-K servers (docs/tuner.md). Powers of two keep the small sizes,
# where the best length changes fastest, and steps of 32 past 64 (with 80 and 96, where the
# k = 3 -> 2 edge of a Qwen3-4B-shaped EAGLE-3 pair fell) bound the interpolation between two
# profiled sizes; the tune adds the sizes where a length's serving step leaves the captured
# graphs. Every B to 16 and every 4 to 64 (default_grid: 52 sizes to 256) costs ~4x the
# profile time and moved no edge in those runs.
GPU_GRID = (1, 2, 4, 8, 16, 32, 64, 80, 96, 128, 160, 192, 224, 256)


def gpu_grid(max_batch_size: int) -> tuple[int, ...]:
    """``GPU_GRID`` up to ``max_batch_size``, which is always in it."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size: {max_batch_size!r} must be >= 1")
    return tuple(sorted({b for b in GPU_GRID if b < max_batch_size} | {max_batch_size}))


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

"""Which (B, k) decode steps find no full CUDA graph of their own query length, as vLLM 0.33.0's
V2 runner picks graphs (``CudaGraphManager._init_candidates`` in
``vllm/v1/worker/gpu/cudagraph_utils.py``, read in the 0.33.0 wheel).

With a draft-length table, the runner captures a full uniform-decode graph for every query
length q = 1 + k the table uses, at each capture size rounded up to a multiple of q (and at most
``max_num_seqs`` requests). A step of n = B * q tokens is then given the full graphs of the
*smallest* captured token count >= n only. When that count holds graphs of other query lengths
alone, the step runs its piecewise graph instead: TableTune's compat fix
graph-candidates-for-every-length adds the smallest graph of the missing length. This script
lists the batch sizes where that happens, for the capture sizes a server recorded beside its
step log (``*.steps.engine.json``, ``cudagraph_capture_sizes``) or vLLM's default ones.

usage: python benchmarks/gpu/graph_candidates.py [--engine-facts FILE.steps.engine.json]
       [--max-size 1024] [--lengths 0,1,2,3] [--max-num-seqs 256] [--fixed]
A file it cannot read or an option out of range: exit 2 with one line ``error: ...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Beside this script (its folder is on sys.path when it runs).
from serving_turns import fail

from tabletune.core.cpu_sets import format_cpu_list  # writes any sorted ints as ranges


def default_capture_sizes(max_size: int) -> list[int]:
    """vLLM 0.33.0's default capture sizes up to ``max_size`` (``config/vllm.py``)."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return [s for s in sizes if s <= max_size]


def full_graphs(capture_sizes: list[int], query_lengths: list[int],
                max_num_seqs: int) -> dict[int, set[int]]:
    """{token count: the query lengths with a full uniform-decode graph of that many tokens}:
    each capture size rounded up to a multiple of q, within the largest capture size and
    ``max_num_seqs`` requests (as ``_init_candidates`` builds its descriptors)."""
    largest = max(capture_sizes)
    graphs: dict[int, set[int]] = {}
    for size in capture_sizes:
        for q in query_lengths:
            tokens = -(-size // q) * q
            if tokens <= min(largest, max_num_seqs * max(query_lengths)) \
                    and tokens // q <= max_num_seqs:
                graphs.setdefault(tokens, set()).add(q)
    return graphs


def misses(capture_sizes: list[int], lengths: list[int], max_num_seqs: int, *,
           fixed: bool = False) -> dict[int, list[int]]:
    """{k: the batch sizes whose decode step of B * (1 + k) tokens runs without a full graph of
    its length}. ``fixed``: with the compat fix (the smallest graph of the missing length)."""
    query_lengths = sorted({1 + k for k in lengths})
    graphs = full_graphs(capture_sizes, query_lengths, max_num_seqs)
    counts = sorted(graphs)
    out: dict[int, list[int]] = {}
    for k in lengths:
        q = 1 + k
        missed = []
        for b in range(1, max_num_seqs + 1):
            n = b * q
            bigger = [c for c in counts if c >= n]
            if fixed:
                found = any(q in graphs[c] for c in bigger)
            else:  # only the smallest captured count >= n is a candidate
                found = bool(bigger) and q in graphs[bigger[0]]
            if not found:
                missed.append(b)
        out[k] = missed
    return out


def ranges(sizes: list[int]) -> str:
    """``[4, 5, 6, 9]`` as ``4-6, 9``."""
    return format_cpu_list(sizes).replace(",", ", ") or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-facts", type=Path, default=None)
    parser.add_argument("--max-size", type=int, default=1024)
    parser.add_argument("--lengths", default="0,1,2,3")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--fixed", action="store_true",
                        help="with the compat fix graph-candidates-for-every-length")
    args = parser.parse_args(argv)
    try:
        lengths = sorted({int(x) for x in args.lengths.split(",")})
    except ValueError:
        return fail(f"--lengths: {args.lengths!r}: not a list of whole numbers")
    if not lengths or lengths[0] < 0:
        return fail(f"--lengths: {args.lengths!r}: lengths are 0 or more")
    if args.max_num_seqs < 1 or args.max_size < 1:
        return fail("--max-num-seqs, --max-size: 1 or more")
    if args.engine_facts is not None:
        try:
            facts = json.loads(args.engine_facts.read_text())
            sizes = sorted(int(s) for s in facts["cudagraph_capture_sizes"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return fail(f"{args.engine_facts}: no capture sizes to read ({e})")
        if not sizes:
            return fail(f"{args.engine_facts}: the server captured no CUDA graphs")
        source = f"{args.engine_facts} ({len(sizes)} capture sizes up to {sizes[-1]})"
    else:
        sizes = default_capture_sizes(args.max_size)
        source = f"vLLM's default capture sizes up to {args.max_size}"
    print(f"capture sizes: {source}; max_num_seqs {args.max_num_seqs}"
          f"{'; with graph-candidates-for-every-length' if args.fixed else ''}")
    for k, missed in misses(sizes, lengths, args.max_num_seqs, fixed=args.fixed).items():
        print(f"k = {k} (q = {k + 1}): {len(missed)} batch sizes without a full graph: "
              f"{ranges(missed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

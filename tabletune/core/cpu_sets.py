"""Which host cores the engine core, the API server and TableTune's client run on.

A GPU step of 4–20 ms is partly host time (the scheduler, the launch path): when the client
sending the load, vLLM's API server (tokenizing, detokenizing, streaming) and the engine core
share cores, a busy second of one is a slower step of the other. A ``CpuPlan`` gives each its
own cores: the engine core a few of its own, the API server the next few, the client the rest.
Pure: lists of core numbers in, lists out; the launcher and the scheduler apply them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CpuPlan", "parse_cpu_list", "format_cpu_list", "plan_cpus", "MIN_CORES"]

# Below this many usable cores there is nothing to spread (2 for the engine core, 2 for the
# API server, 2 for the client).
MIN_CORES = 6


# Linux's own limit on core numbers (CONFIG_NR_CPUS is at most 8192).
MAX_CORE = 8191


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"1-3,8"`` (the kernel's cpulist form) -> (1, 2, 3, 8)."""
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"{text!r}: {part!r} is not N or A-B") from None
        if first < 0 or last < first:
            raise ValueError(f"{text!r}: {part!r} is not a range of core numbers")
        if last > MAX_CORE:  # refused before a range of a billion cores fills the memory
            raise ValueError(f"{text!r}: {part!r} names core {last}, above {MAX_CORE}")
        cores.update(range(first, last + 1))
    if not cores:
        raise ValueError(f"{text!r}: names no core")
    return tuple(sorted(cores))


def format_cpu_list(cores) -> str:
    """(1, 2, 3, 8) -> ``"1-3,8"``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cores)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


@dataclass(frozen=True)
class CpuPlan:
    """Cores for the engine core process, the API server (and anything else vLLM starts), and
    the client; disjoint."""

    engine: tuple[int, ...]
    frontend: tuple[int, ...]
    client: tuple[int, ...]

    def __post_init__(self) -> None:
        parts = (self.engine, self.frontend, self.client)
        if not all(parts):
            raise ValueError(f"cpu plan: every part needs a core: {self.describe()}")
        if len(set().union(*parts)) != sum(len(p) for p in parts):
            raise ValueError(f"cpu plan: the parts share cores: {self.describe()}")

    def describe(self) -> str:
        return (f"engine core on {format_cpu_list(self.engine)}, API server on "
                f"{format_cpu_list(self.frontend)}, client on {format_cpu_list(self.client)}")

    def to_dict(self) -> dict:
        return {"engine": format_cpu_list(self.engine),
                "frontend": format_cpu_list(self.frontend),
                "client": format_cpu_list(self.client)}


def plan_cpus(available, engine_cores: int = 2, frontend_cores: int = 2) -> CpuPlan | None:
    """Split the cores this process may use: core 0 (where the kernel's housekeeping and many
    interrupts land) is left out when there are enough, then ``engine_cores`` for the engine
    core, ``frontend_cores`` for the API server, the rest for the client. None when there are
    fewer than ``MIN_CORES`` usable cores."""
    cores = sorted(set(available))
    if len(cores) > MIN_CORES and cores[0] == 0:
        cores = cores[1:]
    if len(cores) < max(MIN_CORES, engine_cores + frontend_cores + 1):
        return None
    engine = tuple(cores[:engine_cores])
    frontend = tuple(cores[engine_cores:engine_cores + frontend_cores])
    client = tuple(cores[engine_cores + frontend_cores:])
    return CpuPlan(engine, frontend, client)

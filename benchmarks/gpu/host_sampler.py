"""What the lent machine did, once a second, while a job measured on it: the host's CPU time by
kind (steal, interrupts, iowait included), each core's busy and stolen share, the cores' clock,
the busiest processes and the core each last ran on, and the GPU's
SM clock, power, temperature, utilization and the reasons the driver gives for holding the clock
down. A serving window that ran slower than its neighbours at the same tokens a step can then be
set beside the machine's state during it (``report.py`` on an evaluation joins them by wall time).

Standard library only (it runs beside the job with the system's python3). One JSON line a
sample, until SIGTERM or SIGINT.

usage: python3 host_sampler.py OUT.jsonl [--every 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
import time

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Newer drivers call the reasons "clocks_event_reasons"; older ones "clocks_throttle_reasons".
GPU_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu",
              "clocks_event_reasons.active")
GPU_FIELDS_OLD = GPU_FIELDS[:-1] + ("clocks_throttle_reasons.active",)
TOP_PROCESSES = 8


def cpu_ticks() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:1 + len(CPU_FIELDS)]]


def core_ticks() -> list[list[int]]:
    """Per core (``cpuN`` lines of /proc/stat, in order): its ticks by CPU_FIELDS."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                out.append([int(x) for x in values[:len(CPU_FIELDS)]])
    return out


def core_mhz() -> list[float]:
    out = []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                out.append(float(line.split(":")[1]))
    return out


def process_ticks() -> dict[int, tuple[str, int, int]]:
    """pid -> (name, user + system ticks, the core its main thread last ran on) for every
    process that can be read."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        # fields[0] is stat's 3rd field: utime and stime are its 14th and 15th, processor its 39th
        out[int(name)] = (comm, int(fields[11]) + int(fields[12]), int(fields[36]))
    return out


def per_core(now: list[list[int]], before: list[list[int]]) -> dict:
    """Each core's busy and stolen share of the interval (``cores_busy_each``,
    ``cores_steal_each``, in core order); {} when the cores changed between the readings."""
    if len(now) != len(before):
        return {}
    busy, steal = [], []
    for a, b in zip(now, before):
        deltas = [x - y for x, y in zip(a, b)]
        total = sum(deltas) or 1
        busy.append(round(1 - (deltas[3] + deltas[4]) / total, 3))  # idle and iowait
        steal.append(round(deltas[7] / total, 4))
    return {"cores_busy_each": busy, "cores_steal_each": steal}


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return ""


class GpuReader:
    """``nvidia-smi --query-gpu ... -lms`` in the background; ``latest`` is its newest line."""

    def __init__(self, every_ms: int) -> None:
        self.latest: dict | None = None
        self.proc = None
        for fields in (GPU_FIELDS, GPU_FIELDS_OLD):
            try:
                proc = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={','.join(fields)}",
                     "--format=csv,noheader,nounits", f"-lms={every_ms}"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:  # no driver here: the host's side only
                return
            first = proc.stdout.readline()
            if first and "Field" not in first and "nvalid" not in first:
                self.fields, self.proc = fields, proc
                self._parse(first)
                threading.Thread(target=self._read, daemon=True).start()
                return
            proc.kill()

    def _parse(self, line: str) -> None:
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(self.fields):
            self.latest = {"t": time.time(), **dict(zip(self.fields, values))}

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._parse(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--every", type=float, default=1.0)
    args = ap.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    hz = os.sysconf("SC_CLK_TCK")
    cores = os.cpu_count() or 1
    gpu = GpuReader(int(args.every * 1000))
    named: set[int] = set()
    before_cpu, before_procs, before_t = cpu_ticks(), process_ticks(), time.monotonic()
    before_cores = core_ticks()
    with open(args.out, "a") as out:
        while not stop.wait(args.every):
            now_cpu, now_procs, now_t = cpu_ticks(), process_ticks(), time.monotonic()
            now_cores = core_ticks()
            dt = now_t - before_t
            deltas = [a - b for a, b in zip(now_cpu, before_cpu)]
            total = sum(deltas) or 1
            busy = [(pid, comm, (ticks - before_procs[pid][1]) / hz / dt)
                    for pid, (comm, ticks, _core) in now_procs.items() if pid in before_procs]
            busy.sort(key=lambda p: -p[2])
            top = [[pid, comm, round(share, 3)] for pid, comm, share in busy[:TOP_PROCESSES]
                   if share > 0.01]
            sample = {"t": round(time.time(), 3), "mono": round(now_t, 3),
                      "cpu": {f: round(d / total, 4) for f, d in zip(CPU_FIELDS, deltas)},
                      "cores_busy": round((1 - deltas[3] / total) * cores, 2),
                      "mhz": sorted(core_mhz()), "load1": os.getloadavg()[0], "top": top,
                      "gpu": gpu.latest,
                      # Does a slow second of the engine core follow the core it runs on?
                      "core_of": {str(pid): now_procs[pid][2] for pid, _, _ in top},
                      **per_core(now_cores, before_cores)}
            new = {pid: command_line(pid) for pid, _, _ in top if pid not in named}
            if new:
                named.update(new)
                sample["commands"] = new
            out.write(json.dumps(sample) + "\n")
            out.flush()
            before_cpu, before_procs, before_t = now_cpu, now_procs, now_t
            before_cores = now_cores
    gpu.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

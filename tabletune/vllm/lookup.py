"""The object TableTune puts where vLLM's scheduler keeps its dense ``dynamic_sd_lookup``.

No vLLM import: the scheduler subclass (``tabletune.vllm.scheduler``) installs it.
"""

from __future__ import annotations

import logging
import os

from tabletune.core.files import parse_json, read_regular_file

from tabletune.core.vllm_contract import control_lookup

# Under "vllm." so records go through vLLM's own log handlers in the engine process.
logger = logging.getLogger("vllm.tabletune.scheduler")


class ControlFile:
    """Polls the control file (``tabletune.core.vllm_contract.write_control`` writes it);
    re-reads it only when its mtime changes (one stat per step).

    ``{"force_k": k}`` pins k for every batch size (the one-launch profiler);
    ``{"table": [[start, end, k], ...]}`` serves that table instead of the one the server was
    started with (``tabletune evaluate`` switches arms on one server this way). A file that
    cannot be read keeps the previous setting.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.mtime_ns = -1
        self.force_k: int | None = None
        self.table_lookup: list[int] | None = None

    def poll(self) -> int | None:
        if not self.path:
            return None
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self.force_k = None
            self.table_lookup = None
            return None
        if mtime != self.mtime_ns:
            self.mtime_ns = mtime
            # Regular file only, never blocking (a FIFO here would stall every engine step),
            # strict JSON; an error keeps the previous setting like any unreadable file.
            doc = parse_json(read_regular_file(self.path, "control file"), self.path,
                             "control file")
            value = doc.get("force_k")
            self.force_k = None if value is None else int(value)
            self.table_lookup = control_lookup(doc.get("table"))
        return self.force_k


class StepLookup:
    """Stands in for vLLM's dense ``dynamic_sd_lookup`` list (index = batch size)."""

    def __init__(self, static_lookup: list[int], max_k: int, control: ControlFile,
                 controller=None) -> None:
        self.last_good = list(static_lookup)
        self.max_k = max_k
        self.control = control
        self.controller = controller
        self._failed_once = False

    def __len__(self) -> int:
        return len(self.last_good)

    def _fallback(self, batch_size: int) -> int:
        return self.last_good[min(batch_size, len(self.last_good) - 1)]

    def __getitem__(self, batch_size: int) -> int:
        try:
            forced = self.control.poll()
            if forced is not None:
                return max(0, min(forced, self.max_k))
            table = self.control.table_lookup
            if table is not None:
                return max(0, min(table[min(batch_size, len(table) - 1)], self.max_k))
            if self.controller is not None:
                k = self.controller.k_for_step(batch_size)
                return max(0, min(int(k), self.max_k))
        except Exception:  # the engine must never go down because of TableTune
            self._fail("choosing k")
        return self._fallback(batch_size)

    def _fail(self, what: str) -> None:
        if not self._failed_once:
            logger.exception("TableTune failed while %s; running on the last good table", what)
            self._failed_once = True
        try:
            # The controller's latest table is the last good one; keep serving it.
            table = self.controller.estimator.table
            self.last_good = [0] + table.lookup(len(self.last_good) - 1)
        except Exception:
            pass
        try:
            self.controller.turn_off(f"failed while {what}; serving its last table")
        except Exception:
            pass
        self.controller = None

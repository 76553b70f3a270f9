"""Timing cells on a running vLLM server: ``CellTimer`` sends a batch of B prompts with the
draft length pinned and keeps, from TableTune's step log, the batch's pure decode steps (exactly
B requests, none prefilling, each verifying and drafting k). It is what the schedule's
``measure`` boundary calls in a real profile."""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

from tabletune.engine.client import run_batch
from tabletune.engine.server import EngineError, VllmServer
from tabletune.tuner.profile_settings import ProfileSettings
from tabletune.tuner.raw_cell import Repeat, median


class CellTimer:
    """Measures cells on one running server (acceptance on, the step log on) whose draft length
    is pinned to ``k``."""

    def __init__(self, server: VllmServer, model: str, prompts: Sequence[str],
                 settings: ProfileSettings) -> None:
        self.server = server
        self.model = model
        self.prompts = list(prompts)
        self.settings = settings

    def warm_up(self, batch_size: int) -> None:
        self.server.guarded(run_batch, self.server.base_url, self.model,
                            self.prompts[:batch_size], max_tokens=8)

    def one_repeat(self, batch_size: int, k: int, output_tokens: int | None = None
                   ) -> tuple[float, float | None, int, list]:
        """B requests at once for ``output_tokens`` each (the settings' unless given); the
        repeat's pure decode steps (exactly B requests, none prefilling, each verifying and
        drafting k) from the step log: they run from the batch's prefill until its first
        request finishes."""
        records, client_ms = self._timed_batch(
            batch_size, output_tokens or self.settings.output_tokens, f"k={k}")
        periods = [round(st.period_ms, 4) for st in records
                   if st.requests == batch_size and st.pure_decode_k() == k]
        return client_ms, (median(periods) if periods else None), len(periods), periods

    def reference_reading(self, batch_size: int, k: int
                          ) -> tuple[float, float | None, int, list]:
        """A reading of the drift guard's reference cell: ``one_repeat`` at the settings'
        ``reference_tokens`` (``tuner.schedule``)."""
        return self.one_repeat(batch_size, k, self.settings.reference_tokens)

    def repeat_lengths(self, batch_size: int, lengths: Sequence[int],
                       pin: Callable[[int], None]) -> dict[int, "Repeat"]:
        """One repeat of every cell (``batch_size``, k in ``lengths``) from one batch: the
        lengths take turns in blocks of steps (``tuner.interleave``), each for
        ``output_tokens`` tokens a request on average, so a cell keeps about as many steps as a
        repeat of its own. The client's value (the batch's wall time over its steps) is the
        batch's, the same for every length."""
        from tabletune.tuner.interleave import StepRotation, split_by_length

        if len(lengths) == 1:
            pin(lengths[0])
            return {lengths[0]: self.one_repeat(batch_size, lengths[0])}
        records, client_ms = self._timed_batch(
            batch_size, self.settings.output_tokens * len(lengths), f"lengths {list(lengths)}",
            during=lambda reader: StepRotation(reader, lengths, pin, self.settings.block_steps))
        return {k: (client_ms, (median(periods) if periods else None), len(periods), periods)
                for k, periods in split_by_length(records, batch_size, lengths).items()}

    def _timed_batch(self, batch_size: int, n_out: int, what: str, during=None):
        """B requests at once for ``n_out`` tokens each (inside ``during(reader)``, a context,
        when given), ended when the first request has its tokens: the rest are cancelled, as
        every step after that one holds fewer than B requests and times no cell (the batches'
        ramp-downs were ~30 s of a 515-s CPU main job and ~9 s of an 84-s H200 profile,
        benchmarks/README.md). Returns the step log's records of the batch, and the client's
        view, kept as a cross-check: the batch's wall time over the engine steps it took (its
        prefill included: a window's mean, not a cell value)."""
        reader = self.server.step_log()
        if reader is None:
            raise EngineError(f"{self.server.log_path}: the server keeps no step log (TableTune's "
                              "scheduler did not open it): no step to time a cell with")
        position = reader.position()
        with (during(reader) if during is not None else contextlib.nullcontext()):
            batch = self.server.guarded(run_batch, self.server.base_url, self.model,
                                        self.prompts[:batch_size], max_tokens=n_out,
                                        temperature=self.settings.temperature,
                                        until_first=True)
        self.server.check_alive()
        if not batch.completion_tokens or any(t != n_out for t in batch.completion_tokens):
            raise EngineError(f"asked for {n_out} tokens per request at B={batch_size}, {what}, "
                              f"got {sorted(set(batch.completion_tokens))}")
        records, _lost = reader.since(position)
        steps = sum(1 for st in records if st.requests > 0)
        return records, batch.wall_s * 1000.0 / max(steps, 1)

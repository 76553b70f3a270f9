"""HTTP load against a running vLLM server: one timed batch, or a closed-loop load test."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import aiohttp

from tabletune.core.workload import steady_first_lengths


class RequestFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class BatchResult:
    wall_s: float
    completion_tokens: tuple[int, ...]
    texts: tuple[str, ...] = ()


async def _post_json(session: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    """The JSON answer to one POST; anything but 200 raises RequestFailed."""
    async with session.post(url, json=payload) as resp:
        body = await resp.text()
        if resp.status != 200:
            raise RequestFailed(f"HTTP {resp.status} from {url}: {body[:300]}")
    return json.loads(body)


async def _answer(session: aiohttp.ClientSession, url: str, payload: dict) -> tuple[int, str]:
    """(completion tokens, text) of one completion request."""
    doc = await _post_json(session, url, payload)
    choices = doc.get("choices") or [{}]
    return int(doc["usage"]["completion_tokens"]), str(choices[0].get("text", ""))


async def _complete(session: aiohttp.ClientSession, url: str, payload: dict) -> int:
    return (await _answer(session, url, payload))[0]


def _session(timeout_s: float) -> aiohttp.ClientSession:
    # A fresh connection per request: the server closes idle keep-alive connections and a
    # reused one fails with a read error under many concurrent requests.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


def _payload(model: str, prompt: str, max_tokens: int, temperature: float,
             ignore_eos: bool, seed: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "ignore_eos": ignore_eos, "seed": seed}


def request_seed(base: int, index: int) -> int:
    """The sampling seed of the ``index``-th request of a run: distinct for every request.

    vLLM draws a request's random numbers from (its seed, the token position). One seed shared
    by every request gives every request the same random number at the same position: at a
    temperature above 0 their samples are correlated, and under vLLM's synthetic acceptance
    (accept draft i when u(seed, position) < rate_i) every request of a batch follows the same
    accept/reject sequence, so an acceptance run measures a handful of trajectories instead of
    thousands of drafts (on the H200 it read a_1 = 0.816 for a configured 0.75). Distinct seeds
    keep runs reproducible and the requests independent.
    """
    return (base * 1_000_003 + index) % (2**31 - 1)


# progress(done, total, elapsed_s): called every progress_every_s while a batch runs, and once
# when every answer is in.
Progress = Callable[[int, int, float], None]


async def _batch(base_url, model, prompts, max_tokens, temperature, ignore_eos, timeout_s,
                 progress: Progress | None = None, progress_every_s: float = 10.0,
                 seed: int = 0, until_first: bool = False):
    url = base_url + "/v1/completions"
    done = 0

    async def one(index: int, prompt: str) -> tuple[int, str]:
        nonlocal done
        answer = await _answer(session, url,
                               _payload(model, prompt, max_tokens, temperature, ignore_eos,
                                        request_seed(seed, index)))
        done += 1
        return answer

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_every_s)
            progress(done, len(prompts), time.perf_counter() - start)

    async with _session(timeout_s) as session:
        start = time.perf_counter()
        ticker = asyncio.create_task(report()) if progress else None
        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
        try:
            if until_first:
                finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                answers = [task.result() for task in tasks if task in finished]
            else:
                answers = await asyncio.gather(*tasks)
        finally:
            if ticker:
                ticker.cancel()
            # A cancelled request closes its connection: vLLM aborts it at its next step.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - start
    if progress:
        progress(len(answers), len(prompts), wall)
    return BatchResult(wall, tuple(t for t, _ in answers), tuple(x for _, x in answers))


def run_batch(base_url: str, model: str, prompts: Sequence[str], *, max_tokens: int,
              temperature: float = 0.0, ignore_eos: bool = True,
              timeout_s: float = 600.0, progress: Progress | None = None,
              progress_every_s: float = 10.0, seed: int = 0,
              until_first: bool = False) -> BatchResult:
    """Send all ``prompts`` at once and wait for every answer (``until_first``: for the first
    one, the others cancelled, which vLLM aborts: the result holds the answers that were in);
    ``progress`` hears how many have answered every ``progress_every_s`` and at the end.
    Request i samples with seed ``request_seed(seed, i)``."""
    return asyncio.run(_batch(base_url, model, list(prompts), max_tokens, temperature,
                              ignore_eos, timeout_s, progress, progress_every_s, seed,
                              until_first))


async def _token_counts(base_url: str, model: str, prompts: list[str],
                        timeout_s: float) -> list[int]:
    url = base_url + "/tokenize"

    async def one(prompt: str) -> int:
        return int((await _post_json(session, url, {"model": model, "prompt": prompt}))["count"])

    async with _session(timeout_s) as session:
        return list(await asyncio.gather(*[one(p) for p in prompts]))


def prompt_token_counts(base_url: str, model: str, prompts: Sequence[str], *,
                        timeout_s: float = 60.0) -> list[int]:
    """Each prompt's length in tokens as the server tokenizes a completion's prompt (vLLM's
    ``/tokenize``, special tokens included), in order."""
    return asyncio.run(_token_counts(base_url, model, list(prompts), timeout_s))


# A steady window waits at most this long for every client's first answer.
MAX_WARM_UP_S = 120.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """The server's ``/metrics`` text as read at ``t`` (perf_counter seconds) during a load."""

    t: float
    text: str


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    # With ``window``: /metrics read when the steady window opened, at its middle and when it
    # closed (every client still had a request in flight at each of them).
    snapshots: tuple[MetricsSnapshot, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


async def _load(base_url, model, prompts, concurrency, requests_per_worker, max_tokens,
                temperature, timeout_s, min_seconds, window, seed, cut_tail):
    url = base_url + "/v1/completions"
    counter = {"tokens": 0, "requests": 0, "issued": 0}
    snapshots: list[MetricsSnapshot] = []
    closed = False

    def more(i: int) -> bool:
        if window is not None:  # a window: every client busy until it closes, none after
            return not closed
        # At least requests_per_worker each; with min_seconds, keep going until it has passed.
        return i < requests_per_worker or (
            min_seconds is not None and time.perf_counter() - start < min_seconds)

    low, high = max_tokens if isinstance(max_tokens, tuple) else (max_tokens, max_tokens)
    # A steady window wants the loop as it runs once steady from the start: the clients'
    # first requests ask for what a steady loop's requests have left (core.workload).
    first = steady_first_lengths(low, high, concurrency) if window is not None else []

    def length(n: int) -> int:
        if n < len(first):
            return first[n]
        # max_tokens may be a (low, high) range: request n asks for a length spread evenly over
        # it, so requests finish one by one and the batch keeps a steady mix of prefills.
        return low + (n * 7919) % (high - low + 1)

    async def worker(worker_id: int, session):
        i = 0
        while more(i):
            prompt = prompts[(worker_id * requests_per_worker + i) % len(prompts)]
            i += 1
            n = counter["issued"]  # the run's request number: its seed and its length
            counter["issued"] += 1
            # Await first: `counter[...] += await ...` would read the counter before the await
            # and drop every update made by other clients meanwhile.
            tokens = await _complete(session, url,
                                     _payload(model, prompt, length(n), temperature, True,
                                              request_seed(seed, n)))
            counter["tokens"] += tokens
            counter["requests"] += 1

    def raise_a_failed_client(workers) -> None:
        # A client whose request failed (a dead engine answers 500s) ends the load now: the
        # warm-up would otherwise wait MAX_WARM_UP_S for answers that never come.
        for w in workers:
            if w.done() and not w.cancelled() and w.exception() is not None:
                raise w.exception()

    async def read_metrics(session, workers) -> None:
        nonlocal closed
        warm_up, length = window
        # The window opens after the warm-up and once as many requests have finished as there
        # are clients: all of them started together, and only after their first answers are
        # the requests' ages spread out as in steady serving (measured on the H200: 1-s warm-ups
        # read steps up to 1.5x those of a steady loop at B >= 16). At most MAX_WARM_UP_S.
        while time.perf_counter() - start < min(MAX_WARM_UP_S, max(
                warm_up, 0.0 if counter["requests"] >= concurrency else MAX_WARM_UP_S)):
            raise_a_failed_client(workers)
            await asyncio.sleep(0.02)
        opened = time.perf_counter()
        for at in (0.0, length / 2, length):
            await asyncio.sleep(max(0.0, opened + at - time.perf_counter()))
            async with session.get(base_url + "/metrics") as resp:
                text = await resp.text()
            snapshots.append(MetricsSnapshot(time.perf_counter(), text))
        closed = True

    async with _session(timeout_s) as session:
        start = time.perf_counter()
        workers = [asyncio.ensure_future(worker(w, session)) for w in range(concurrency)]
        try:
            if window is not None:
                await read_metrics(session, workers)
                if cut_tail:
                    # The window is what was wanted: cancel what is still in flight (the server
                    # aborts a request whose connection closes) instead of waiting out the
                    # ramp-down.
                    for w in workers:
                        w.cancel()
            results = await asyncio.gather(*workers, return_exceptions=True)
        except BaseException:
            # Every client is ended and its outcome retrieved before the error goes up: a
            # client left with an exception nobody read prints a traceback of its own at exit
            # ("Task exception was never retrieved", one per client, after the tune's error).
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r
        wall = time.perf_counter() - start
    return LoadResult(concurrency, counter["requests"], counter["tokens"], wall,
                      tuple(snapshots))


def run_load(base_url: str, model: str, prompts: Sequence[str], *, concurrency: int,
             requests_per_worker: int, max_tokens: int | tuple[int, int],
             temperature: float = 0.0, timeout_s: float = 1800.0,
             min_seconds: float | None = None, window: tuple[float, float] | None = None,
             seed: int = 0, cut_tail: bool = False) -> LoadResult:
    """Closed loop: ``concurrency`` clients each send ``requests_per_worker`` requests in turn,
    and with ``min_seconds`` go on starting requests until that much time has passed.

    ``window=(warm_up_s, length_s)``: read the server's /metrics when the window opens (after
    ``warm_up_s`` and once as many requests have finished as there are clients), again at the
    window's middle and at its end, and start no request after it; ``cut_tail`` then cancels the requests still running instead of waiting for them.
    With a window, each client's first request asks for what a steady loop's requests have
    left (``core.workload.steady_first_lengths``), so the loop starts as it runs once steady.
    ``max_tokens`` may be a (low, high) range of output lengths, spread over the requests.
    Every request gets its own sampling seed (``request_seed``).
    """
    return asyncio.run(_load(base_url, model, list(prompts), concurrency, requests_per_worker,
                             max_tokens, temperature, timeout_s, min_seconds, window, seed,
                             cut_tail))

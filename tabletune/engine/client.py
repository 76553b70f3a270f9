"""HTTP load against a running vLLM server: one timed batch, or a closed-loop load test."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import aiohttp


class RequestFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class BatchResult:
    wall_s: float
    completion_tokens: tuple[int, ...]


async def _complete(session: aiohttp.ClientSession, url: str, payload: dict) -> int:
    async with session.post(url, json=payload) as resp:
        body = await resp.text()
        if resp.status != 200:
            raise RequestFailed(f"HTTP {resp.status} from {url}: {body[:300]}")
    import json

    return int(json.loads(body)["usage"]["completion_tokens"])


def _session(timeout_s: float) -> aiohttp.ClientSession:
    # A fresh connection per request: the server closes idle keep-alive connections and a
    # reused one fails with a read error under many concurrent requests.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


def _payload(model: str, prompt: str, max_tokens: int, temperature: float,
             ignore_eos: bool) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "ignore_eos": ignore_eos, "seed": 0}


# progress(done, total, elapsed_s): called every progress_every_s while a batch runs, and once
# when every answer is in.
Progress = Callable[[int, int, float], None]


async def _batch(base_url, model, prompts, max_tokens, temperature, ignore_eos, timeout_s,
                 progress: Progress | None = None, progress_every_s: float = 10.0):
    url = base_url + "/v1/completions"
    done = 0

    async def one(prompt: str) -> int:
        nonlocal done
        tokens = await _complete(session, url,
                                 _payload(model, prompt, max_tokens, temperature, ignore_eos))
        done += 1
        return tokens

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_every_s)
            progress(done, len(prompts), time.perf_counter() - start)

    async with _session(timeout_s) as session:
        start = time.perf_counter()
        ticker = asyncio.create_task(report()) if progress else None
        try:
            tokens = await asyncio.gather(*[one(p) for p in prompts])
        finally:
            if ticker:
                ticker.cancel()
        wall = time.perf_counter() - start
    if progress:
        progress(len(prompts), len(prompts), wall)
    return BatchResult(wall, tuple(tokens))


def run_batch(base_url: str, model: str, prompts: Sequence[str], *, max_tokens: int,
              temperature: float = 0.0, ignore_eos: bool = True,
              timeout_s: float = 600.0, progress: Progress | None = None,
              progress_every_s: float = 10.0) -> BatchResult:
    """Send all ``prompts`` at once and wait for every answer; ``progress`` hears how many
    have answered every ``progress_every_s`` and at the end."""
    return asyncio.run(_batch(base_url, model, list(prompts), max_tokens, temperature,
                              ignore_eos, timeout_s, progress, progress_every_s))


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


async def _load(base_url, model, prompts, concurrency, requests_per_worker, max_tokens,
                temperature, timeout_s, min_seconds):
    url = base_url + "/v1/completions"
    counter = {"tokens": 0, "requests": 0}

    def more(i: int) -> bool:
        # At least requests_per_worker each; with min_seconds, keep going until it has passed.
        return i < requests_per_worker or (
            min_seconds is not None and time.perf_counter() - start < min_seconds)

    async def worker(worker_id: int, session):
        i = 0
        while more(i):
            prompt = prompts[(worker_id * requests_per_worker + i) % len(prompts)]
            i += 1
            # Await first: `counter[...] += await ...` would read the counter before the await
            # and drop every update made by other clients meanwhile.
            tokens = await _complete(session, url,
                                     _payload(model, prompt, max_tokens, temperature, True))
            counter["tokens"] += tokens
            counter["requests"] += 1

    async with _session(timeout_s) as session:
        start = time.perf_counter()
        await asyncio.gather(*[worker(w, session) for w in range(concurrency)])
        wall = time.perf_counter() - start
    return LoadResult(concurrency, counter["requests"], counter["tokens"], wall)


def run_load(base_url: str, model: str, prompts: Sequence[str], *, concurrency: int,
             requests_per_worker: int, max_tokens: int, temperature: float = 0.0,
             timeout_s: float = 1800.0, min_seconds: float | None = None) -> LoadResult:
    """Closed loop: ``concurrency`` clients each send ``requests_per_worker`` requests in turn,
    and with ``min_seconds`` go on starting requests until that much time has passed."""
    return asyncio.run(_load(base_url, model, list(prompts), concurrency, requests_per_worker,
                             max_tokens, temperature, timeout_s, min_seconds))

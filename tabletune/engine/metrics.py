"""Read what a vLLM server reports about its work: the engine steps its log records
(``--enable-logging-iteration-details``) and the counters its Prometheus ``/metrics`` exposes.

Pure parsing of text the server wrote; fetching that text is ``tabletune.engine.server``'s job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class IterationRecord:
    """One engine step as vLLM logs it with ``--enable-logging-iteration-details``."""

    index: int
    context_requests: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float


_ITERATION_RE = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
    r"(\d+) generation requests, (\d+) generation tokens, "
    r"iteration elapsed time: ([0-9.]+) ms"
)


def parse_iterations(text: str) -> list[IterationRecord]:
    records = []
    for m in _ITERATION_RE.finditer(text):
        records.append(IterationRecord(
            index=int(m.group(1)), context_requests=int(m.group(2)),
            generation_requests=int(m.group(4)), generation_tokens=int(m.group(5)),
            elapsed_ms=float(m.group(6)),
        ))
    return records


# "torch.AcceleratorError: CUDA error: ...", "RuntimeError: ...": an exception's last line.
_ERROR_RE = re.compile(r"\b((?:\w+\.)*\w*(?:Error|Exception)): (\S.*)")
_LEVEL_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING)\b")


def first_error(text: str) -> str | None:
    """The first exception line (``SomeError: message``) of a server log's tail, else None.

    When the engine core dies under a living API server, the server answers HTTP 500 and its
    log names the cause first, then the consequences (``EngineDeadError``, the API server's
    own tracebacks); lines logged at INFO or WARNING (vLLM's ulimit warning quotes an
    ``OSError``) are no cause."""
    for line in text.splitlines():
        match = _ERROR_RE.search(line)
        if match and not _LEVEL_RE.search(line[:match.start()]):
            return f"{match.group(1)}: {match.group(2).strip()}"[:300]
    return None


_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition → (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line.strip())
        if not m:
            continue
        labels = dict(_LABEL_RE.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        samples.append((m.group(1), labels, value))
    return samples


@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's cumulative speculative-decoding counters at one moment."""

    num_drafts: float
    num_draft_tokens: float
    accepted_per_position: tuple[float, ...]

    @classmethod
    def from_metrics(cls, samples, max_k: int) -> "SpecDecodeCounters":
        drafts = draft_tokens = 0.0
        per_pos = [0.0] * max_k
        for name, labels, value in samples:
            if name == "vllm:spec_decode_num_drafts_total":
                drafts += value
            elif name == "vllm:spec_decode_num_draft_tokens_total":
                draft_tokens += value
            elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                pos = int(labels.get("position", -1))
                if 0 <= pos < max_k:
                    per_pos[pos] += value
        return cls(drafts, draft_tokens, tuple(per_pos))

    def minus(self, before: "SpecDecodeCounters") -> "SpecDecodeCounters":
        return SpecDecodeCounters(
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            tuple(a - b for a, b in zip(self.accepted_per_position, before.accepted_per_position)),
        )


@dataclass(frozen=True)
class EngineCounters:
    """vLLM's cumulative step and token counters at one moment (its /metrics)."""

    # Engine steps that produced output: vLLM observes its iteration-tokens histogram once per
    # step, so the histogram's count is the step count.
    steps: float
    generation_tokens: float
    spec: SpecDecodeCounters

    @classmethod
    def from_metrics(cls, samples, max_k: int) -> "EngineCounters":
        steps = generated = 0.0
        for name, _, value in samples:
            if name == "vllm:iteration_tokens_total_count":
                steps += value
            elif name == "vllm:generation_tokens_total":
                generated += value
        return cls(steps, generated, SpecDecodeCounters.from_metrics(samples, max_k))

    def minus(self, before: "EngineCounters") -> "EngineCounters":
        return EngineCounters(self.steps - before.steps,
                              self.generation_tokens - before.generation_tokens,
                              self.spec.minus(before.spec))

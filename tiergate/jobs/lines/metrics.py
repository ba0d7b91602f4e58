"""OpenAI batch figures on the worker's ``/metrics``: the lines and tokens this worker
answered (counted once, by the worker whose answers were written: summed over the fleet,
each line counts once), the chunks it took and how long each took, and the chunks its
sweep sent again. A batch's own usage is in its batch object (``usage``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from tiergate.jobs.lines.store import ChunkCounts

_CHUNK_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)


class LineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines_total = Counter(
            "tiergate_openai_batch_lines_total",
            "OpenAI batch lines answered, by outcome (completed, failed, skipped)",
            ["outcome"],
            registry=registry,
        )
        self.tokens_total = Counter(
            "tiergate_openai_batch_tokens_total",
            "Tokens of the OpenAI batch lines answered (the engines' usage), by kind",
            ["kind"],
            registry=registry,
        )
        self.chunks_total = Counter(
            "tiergate_openai_batch_chunks_total",
            "OpenAI batch chunks taken, by result (answered, already, gone, failed)",
            ["result"],
            registry=registry,
        )
        self.chunk_seconds = Histogram(
            "tiergate_openai_batch_chunk_seconds",
            "One chunk of an OpenAI batch, from taken to answered",
            buckets=_CHUNK_BUCKETS,
            registry=registry,
        )
        self.chunks_resent_total = Counter(
            "tiergate_openai_batch_chunks_resent_total",
            "Chunks the sweep sent again because their record was lost",
            registry=registry,
        )

    def answered(self, counts: ChunkCounts) -> None:
        """A chunk whose answers this worker wrote."""
        for outcome, n in (
            ("completed", counts.completed),
            ("failed", counts.failed),
            ("skipped", counts.skipped),
        ):
            self.lines_total.labels(outcome).inc(n)
        self.tokens_total.labels("input").inc(counts.input_tokens)
        self.tokens_total.labels("output").inc(counts.output_tokens)

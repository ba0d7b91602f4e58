"""``tiergate bench sandbox``: how long an environment takes to build, and how long a job
waits from a worker picking it up to its first command starting, cold and warm.

What is measured, and how:
- build: ``mmdebstrap`` for ``environments/default.yaml`` (:func:`tiergate.envs.build.build`),
  wall-clock, with the Debian mirror over the network (its speed is part of the figure);
- pickup to first command: :meth:`JobRunner.process` is called directly with a job message
  (no Kafka: the broker's delivery time is not the sandbox's), against a local SeaweedFS
  S3 started for the run, with the real breaker, lifecycle writes, environment resolution,
  fetch and unpack, cgroup, seccomp and bubblewrap. It starts when ``process`` is entered
  (``JobRunner.picked_up``) and ends (a) when the first setup command is handed to its
  process (``Sandbox.first_spawn``, the hook in the sandbox; that process is made ahead, in
  the job's cgroup, while the pickup's reads go on) and (b) when that command, ``date
  +%s.%N``, runs inside the sandbox (the time it prints: bubblewrap's setup included);
- cold: the worker's environment cache emptied before each job (fetch from S3, sha256,
  unpack included); warm: cached; and the same jobs in the worker's own system (no
  environment) for comparison;
- floor: :class:`Sandbox` made and its first command spawned and run, without the runner
  or S3, to show what the sandbox itself costs.

The model is a stub that answers DONE at once (the agent loop starts after setup).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

from tiergate.bench.gateway import cpu_model
from tiergate.bench.report import write_report
from tiergate.envs.build import build
from tiergate.envs.manifest import load_manifest
from tiergate.envs.registry import Registry
from tiergate.jobs.run.agent import ModelClient
from tiergate.jobs.run.context import RunContext
from tiergate.jobs.run.runner import JobRunner
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.local.servers import LOCAL_CREDENTIALS, ensure_bucket, object_store
from tiergate.protocol import JobCreate, JobLimits, JobMessage
from tiergate.queue.pipeline import JobQueue
from tiergate.sandbox import Sandbox

FIRST = "date +%s.%N"


def _say(message: str) -> None:
    print(f"[bench sandbox] {message}", file=sys.stderr, flush=True)


class _Done:
    """A model that is done at once."""

    def chat(self, messages: Any, tools: Any) -> dict[str, Any]:
        return {"choices": [{"message": {"role": "assistant", "content": "DONE"}}]}

    def close(self) -> None:
        pass


class _NoQueue:
    def retry_later(self, message: JobMessage) -> None:
        raise RuntimeError(f"job {message.id} asked for a retry in the benchmark")

    def dead_letter(self, message: JobMessage) -> None:
        raise RuntimeError(f"job {message.id} failed in the benchmark")


def _stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(p99, 2),
        "min_ms": round(ordered[0], 2),
        "max_ms": round(ordered[-1], 2),
    }


def _job(runner: JobRunner, store: JobStore, environment: str) -> tuple[float, float]:
    """One job: (pickup to spawn, pickup to the first command running) in ms."""
    job_id = f"job_{uuid.uuid4().hex}"
    spec = JobCreate(
        model="bench",
        instruction="Say DONE.",
        environment=environment,
        setup=[FIRST],
        limits=JobLimits(max_steps=1, timeout_seconds=60),
    )
    outcome = runner.process(JobMessage(id=job_id, owner="bench", spec=spec))
    final = store.final(job_id)
    if outcome != "finished" or final is None or final.status.value != "completed":
        raise RuntimeError(f"the job did not complete: {outcome} {final}")
    raw = store.read_artifact(job_id, "trajectory") or b""
    setup = next(json.loads(line) for line in raw.decode().splitlines() if '"setup"' in line)
    ran = float(setup["output"].strip())
    assert runner.first_spawn is not None
    return (runner.first_spawn - runner.picked_up) * 1000, (ran - runner.picked_up) * 1000


def _floor(settings: JobsSettings, root: Path | None, n: int) -> dict[str, Any]:
    spawn, ran = [], []
    for _ in range(n):
        started = time.time()
        box = Sandbox(f"floor-{uuid.uuid4().hex[:12]}", JobLimits(), settings.sandbox, root=root)
        try:
            result = box.run(FIRST, timeout=30)
        finally:
            box.close()
        assert box.first_spawn is not None
        spawn.append((box.first_spawn - started) * 1000)
        ran.append((float(result.output.strip()) - started) * 1000)
    return {"spawn": _stats(spawn), "first_command": _stats(ran)}


def run_sandbox_benchmark(
    out: Path, manifest_path: Path, cold: int, warm: int, builds: int
) -> dict[str, Any]:
    manifest = load_manifest(manifest_path)
    work = Path(tempfile.mkdtemp(prefix="tiergate-bench-sandbox-", dir="/tmp"))
    work.chmod(0o755)
    report: dict[str, Any] = {
        "command": f"tiergate bench sandbox --manifest {manifest_path} --cold {cold} "
        f"--warm {warm} --builds {builds}",
        "cpu": cpu_model(),
        "manifest": manifest.model_dump(mode="json"),
    }
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    s3 = object_store(work / "s3", work / "s3.log")
    try:
        _say("starting SeaweedFS")
        s3.start()
        settings = JobsSettings.model_validate(
            {
                "storage": {"endpoint_url": s3.url, "bucket": "bench"},
                "sandbox": {
                    "work_dir": str(work / "jobs"),
                    "cache_dir": str(work / "cache"),
                },
            }
        )
        ensure_bucket(s3.url, "bench")
        store = JobStore(settings.storage)
        builds_s, digests = [], []
        built = None
        for i in range(builds):
            _say(f"building {manifest.name} with mmdebstrap ({i + 1}/{builds})")
            built = build(manifest, work / f"build-{i}.tar")
            builds_s.append(round(built.seconds, 2))
            digests.append(built.digest)
            _say(f"built {built.digest[:12]} in {built.seconds:.1f} s, {built.bytes} bytes")
        assert built is not None
        report["build"] = {
            "seconds": builds_s,
            "bytes": built.bytes,
            "digests": digests,
            "reproducible": len(set(digests)) == 1,
        }
        # Registered under another name, so that "default" stays unregistered and runs in
        # the worker's own system (the comparison); the digest is the same.
        name = "bench-env"
        renamed = manifest.model_copy(update={"name": name})
        Registry(store.objects).register(dataclasses.replace(built, manifest=renamed))
        runner = JobRunner(
            RunContext(
                settings,
                store,
                cast(JobQueue, _NoQueue()),
                model_client=lambda message: cast(ModelClient, _Done()),
            )
        )
        cache = work / "cache"
        results: dict[str, Any] = {}
        _job(runner, store, name)  # the first job of the process pays imports: not counted

        samples: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": [], "host": []}
        for i in range(cold):
            shutil.rmtree(cache, ignore_errors=True)
            samples["cold"].append(_job(runner, store, name))
            _say(f"cold {i + 1}/{cold}: {samples['cold'][-1][1]:.0f} ms")
        for _ in range(warm):
            samples["warm"].append(_job(runner, store, name))
        _say(f"warm: median {statistics.median(s[1] for s in samples['warm']):.1f} ms")
        for _ in range(warm):
            samples["host"].append(_job(runner, store, "default"))
        _say(f"host: median {statistics.median(s[1] for s in samples['host']):.1f} ms")
        for key, rows in samples.items():
            results[key] = {
                "spawn": _stats([r[0] for r in rows]),
                "first_command": _stats([r[1] for r in rows]),
            }
        root = cache / "envs" / built.digest / "rootfs"
        results["floor_env"] = _floor(settings, root, warm)
        results["floor_host"] = _floor(settings, None, warm)
        report["pickup_to_first_command"] = results
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_report(out, "sandbox-bench", report, render(report))
    return report


def render(r: dict[str, Any]) -> str:
    b = r["build"]
    p = r["pickup_to_first_command"]
    rows = [
        "# Environments: build time and pickup-to-first-command",
        "",
        f"Command: `{r['command']}`  ",
        f"CPU: {r['cpu']}",
        "",
        f"## Build ({r['manifest']['name']}: {r['manifest']['suite']} "
        f"{r['manifest']['variant']} + {', '.join(r['manifest']['packages'])})",
        "",
        f"mmdebstrap, mirror {r['manifest']['mirror']}: "
        + ", ".join(f"{s:.1f} s" for s in b["seconds"])
        + f"; tar {b['bytes'] / 1e6:.0f} MB; digests "
        + ", ".join(d[:12] for d in b["digests"])
        + (" (identical)" if b["reproducible"] and len(b["digests"]) > 1 else ""),
        "",
        "## Pickup to first command",
        "",
        "From `JobRunner.process` being called with the job's message (no Kafka) to the "
        "first setup command handed to its process (spawn) and to that command running inside "
        "bubblewrap (first command); local SeaweedFS S3, real breaker, lifecycle writes, "
        "cgroup, seccomp. The floor rows: the sandbox alone (no runner, no S3).",
        "",
        "| case | n | spawn median (ms) | spawn p99 (ms) | first command median (ms) "
        "| first command p99 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    labels = {
        "cold": "environment, cold cache (fetch + unpack)",
        "warm": "environment, warm cache",
        "host": "worker's own system",
        "floor_env": "floor: sandbox alone, environment",
        "floor_host": "floor: sandbox alone, worker's system",
    }
    for key, label in labels.items():
        s, f = p[key]["spawn"], p[key]["first_command"]
        rows.append(
            f"| {label} | {s['n']} | {s['median_ms']:.1f} | {s['p99_ms']:.1f} | "
            f"{f['median_ms']:.1f} | {f['p99_ms']:.1f} |"
        )
    return "\n".join([*rows, ""])

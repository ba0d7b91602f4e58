"""``tiergate bench share``: two keys' backlogs of long jobs on one fleet (issue 33 item 3,
``jobs.fleet_share``; tiergate/jobs/state/share.py).

One run starts :mod:`tiergate.bench.jobs.stack`'s servers with API keys on (two tenants,
``alice`` and ``bob``, and the workers' key) and ``workers`` workers of
:data:`~tiergate.bench.jobs.fleet.CONCURRENCY` slots each. Alice submits ``jobs_per_key``
jobs of ``job_seconds`` each and, once they hold every slot, Bob submits as many. Every
second the bench lists both keys' jobs through the gateway (as each tenant sees them) and
counts who runs and who waits, for ``window_seconds`` after Bob's submission; then it
cancels what is left and checks that no job ran twice.

The figures: Alice's running jobs alone (the whole fleet); once her first jobs have ended
(``job_seconds`` plus the share's refresh after Bob's arrival), her most and median
running jobs while Bob's wait (the share's bound: ``ceil(share x slots)``), Bob's, and how
long Bob waited for his share; how many of Alice's jobs were told ``fleet_share``.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs.fleet import CONCURRENCY
from tiergate.bench.jobs.stack import JobsStack, job_body, keep_logs, new_work_dir, say
from tiergate.bench.report import write_report
from tiergate.gateway.access.auth import new_key
from tiergate.jobs.state.store import JobStore

TENANTS = ("alice", "bob")


@dataclass(frozen=True)
class ShareBenchParams:
    jobs_per_key: int = 50
    job_seconds: float = 20.0
    workers: int = 2
    share: float = 0.5
    window_seconds: float = 90.0

    @property
    def slots(self) -> int:
        return self.workers * CONCURRENCY

    def command(self) -> str:
        return (
            f"tiergate bench share --jobs-per-key {self.jobs_per_key} --job-seconds "
            f"{self.job_seconds:g} --workers {self.workers} --share {self.share:g} "
            f"--window-seconds {self.window_seconds:g}"
        )


@dataclass
class Sample:
    at: float  # seconds after Bob's first submission (negative: before it)
    running: dict[str, int]
    queued: dict[str, int]


def _keys() -> tuple[dict[str, str], dict[str, Any], str]:
    """Each tenant's secret, the gateway's auth tree, the workers' key."""
    secrets: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    for name in TENANTS:
        secrets[name], digest = new_key()
        # Submitting a backlog at once is the point: no per-minute limit in the way.
        entries.append({"name": name, "hash": digest, "limits": {"requests_per_minute": 100_000}})
    worker, digest = new_key()
    entries.append({"name": "workers", "hash": digest, "acts_for_job_owners": True})
    return secrets, {"enabled": True, "keys": entries}, worker


def _count(client: httpx.Client, secret: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(running, queued, every job) of one tenant, as it lists them."""
    jobs: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
        page = client.get("/v1/jobs", params=params, headers={"authorization": f"Bearer {secret}"})
        page.raise_for_status()
        body = page.json()
        jobs += body["data"]
        if not body.get("has_more"):
            break
        after = body["data"][-1]["id"]
    running = sum(j["status"] == "in_progress" for j in jobs)
    return running, sum(j["status"] == "queued" for j in jobs), jobs


def _submit(client: httpx.Client, secret: str, count: int, seconds: float) -> list[str]:
    ids = []
    for _ in range(count):
        resp = client.post(
            "/v1/jobs", json=job_body(seconds), headers={"authorization": f"Bearer {secret}"}
        )
        if resp.status_code != 200:
            raise RuntimeError(f"POST /v1/jobs answered {resp.status_code}: {resp.text}")
        ids.append(resp.json()["id"])
    return ids


def run_share_benchmark(out: Path, params: ShareBenchParams) -> tuple[dict[str, Any], bool]:
    """One run; writes ``jobs-share-bench.{json,md}`` under ``out``; returns the report and
    whether the share held and no job ran twice."""
    work = new_work_dir()
    cpu = cpu_model()
    say(f"CPU: {cpu}; {params.command()}")
    secrets, auth, worker_key = _keys()
    stack = JobsStack(
        work,
        2 * params.jobs_per_key,
        "cooperative-sticky",
        auth=auth,
        jobs={
            "fleet_share": params.share,
            "worker": {"api_key": worker_key},
            "kafka": {"partitions": max(2, params.workers)},
        },
    )
    samples: list[Sample] = []
    told: set[str] = set()
    try:
        gateway_url, settings = stack.start()
        assert stack.fleet is not None
        for index in range(params.workers):
            say(f"starting worker {index + 1} of {params.workers}")
            stack.fleet.add()
        client = httpx.Client(base_url=gateway_url, timeout=30)
        say(f"alice submits {params.jobs_per_key} jobs of {params.job_seconds:g} s")
        ids = {"alice": _submit(client, secrets["alice"], params.jobs_per_key, params.job_seconds)}
        start = time.monotonic()
        alone = 0
        while time.monotonic() - start < 120 and alone < params.slots:
            alone = _count(client, secrets["alice"])[0]
            time.sleep(0.5)
        say(f"alice alone runs {alone} of {params.slots} slots; bob submits {params.jobs_per_key}")
        ids["bob"] = _submit(client, secrets["bob"], params.jobs_per_key, params.job_seconds)
        bob_at = time.monotonic()
        stop = threading.Event()

        def sample() -> None:
            with httpx.Client(base_url=gateway_url, timeout=30) as poller:
                while not stop.is_set():
                    seen = {name: _count(poller, secrets[name]) for name in TENANTS}
                    samples.append(
                        Sample(
                            time.monotonic() - bob_at,
                            {n: seen[n][0] for n in TENANTS},
                            {n: seen[n][1] for n in TENANTS},
                        )
                    )
                    for job in seen["alice"][2]:
                        if (job.get("error") or {}).get("code") == "fleet_share":
                            told.add(job["id"])
                    stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        while time.monotonic() - bob_at < params.window_seconds:
            time.sleep(5)
            last = samples[-1] if samples else None
            if last is not None:
                say(
                    f"{last.at:5.0f} s: running alice {last.running['alice']}, bob "
                    f"{last.running['bob']}; waiting alice {last.queued['alice']}, bob "
                    f"{last.queued['bob']}"
                )
        stop.set()
        sampler.join(30)
        say("cancelling what is left")
        for name in TENANTS:
            for job_id in ids[name]:
                client.post(
                    f"/v1/jobs/{job_id}/cancel",
                    headers={"authorization": f"Bearer {secrets[name]}"},
                )
        store = JobStore(settings.storage)
        twice = [i for n in TENANTS for i in ids[n] if store.deliveries(i) > 1]
        client.close()
    finally:
        with contextlib.suppress(Exception):
            stack.stop()
        keep_logs(work)
    report = _figures(params, cpu, alone, samples, len(told), twice)
    write_report(out, "jobs-share-bench", report, render(report))
    return report, bool(report["share_held"]) and not twice


def _figures(
    params: ShareBenchParams,
    cpu: str,
    alone: int,
    samples: list[Sample],
    told: int,
    twice: list[str],
) -> dict[str, Any]:
    cap = math.ceil(params.share * params.slots)
    # Alice's jobs that were running when Bob arrived end within job_seconds; the share's
    # counts are refreshed every few seconds: judge what comes after.
    settle = params.job_seconds + 10
    settled = [s for s in samples if s.at > settle and s.queued["bob"] > 0]
    reached = next((s.at for s in samples if s.running["bob"] >= params.slots - cap), None)
    alice = [s.running["alice"] for s in settled]
    bob = [s.running["bob"] for s in settled]
    return {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "slots": params.slots,
        "share": params.share,
        "share_cap": cap,
        "alice_alone_running": alone,
        "settled_after_s": settle,
        "settled_samples": len(settled),
        "alice_running_while_bob_waits": _spread(alice),
        "bob_running_while_bob_waits": _spread(bob),
        "bob_reached_his_share_after_s": None if reached is None else round(reached, 1),
        "alice_jobs_told_fleet_share": told,
        "jobs_run_twice": twice,
        "share_held": bool(settled) and max(alice) <= cap,
        "samples": [[round(s.at, 1), s.running, s.queued] for s in samples],
    }


def _spread(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def render(report: dict[str, Any]) -> str:
    a, b = report["alice_running_while_bob_waits"], report["bob_running_while_bob_waits"]
    lines = [
        "# Fleet share: two keys' backlogs",
        "",
        f"`{report['command']}` on {report['cpu']} ({report['cores']} cores).",
        "",
        f"- Slots: {report['slots']}; jobs.fleet_share {report['share']:g}: a key holds at "
        f"most {report['share_cap']} while another key's jobs wait.",
        f"- Alice alone ran {report['alice_alone_running']} of {report['slots']} slots.",
        f"- After Bob submitted, from {report['settled_after_s']:g} s on "
        f"({report['settled_samples']} samples, 1 s apart, while Bob's jobs waited): Alice ran "
        f"{a['min']}-{a['max']} (median {a['median']}), Bob {b['min']}-{b['max']} "
        f"(median {b['median']}).",
        f"- Bob ran his share ({report['slots'] - report['share_cap']}) "
        f"{report['bob_reached_his_share_after_s']} s after his submission.",
        "- Alice's jobs told `fleet_share` while waiting: "
        f"{report['alice_jobs_told_fleet_share']}.",
        f"- Jobs run twice: {len(report['jobs_run_twice'])}.",
        f"- Share held: **{'yes' if report['share_held'] else 'NO'}**.",
        "",
    ]
    return "\n".join(lines)

"""``make up``'s own stack, the real ``tiergate up`` command with real children: a compiled
engine (vLLM's default, what ``make up`` serves; every other e2e test forces eager), the
supervisor restarting a SIGKILLed engine while the tier's requests fall back, and a killed
worker and broker while jobs keep working; then the stack stopped with jobs still queued
and started again on its own data directory, where those jobs run.

One stack for all of it: its engines' starts are most of the test's minutes. It runs beside
the session's engines but shares nothing with them but the prepared model.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import FAST_RECIPE, MODEL
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.evidence import TierDecision
from tiergate.quant.prepare import prepare_profile_model
from tiergate.settings import load_settings
from tiergate.tiers import Tier

READY_SECONDS = 900  # a first compiled start compiles (minutes on the slower CPU kind)
JOB = {
    "model": MODEL,
    "service_tier": "default",
    "instruction": "Create a file named hello.txt that contains the word hello.",
    "setup": [],
    "verifier": {"command": "grep -qi hello hello.txt", "timeout_seconds": 30},
    "limits": {"max_steps": 2, "timeout_seconds": 300},
}
UP = (sys.executable, "-m", "tiergate", "up")
TERMINAL = {"completed", "incomplete", "failed", "cancelled"}


@dataclass
class Stack:
    """One ``tiergate up`` process, its stderr in ``log``."""

    env: dict[str, str]
    log: Path
    base: str
    ports: dict[str, int]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*UP, "--no-default-environment", "--min-free-gib", "0"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return "\n".join(self.said().splitlines()[-40:])

    def wait_serving(self) -> None:
        def serving() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{self.base}/v1/models", timeout=5).status_code == 200
            return False

        eventually(serving, READY_SECONDS, 1.0, lambda: f"tiergate up serving:\n{self.tail()}")

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"tiergate up did not stop on Ctrl-C:\n{self.tail()}") from None

    def child(self, *marks: str) -> int:
        """The pid of the stack's direct child whose command line holds every mark."""
        assert self.proc is not None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            words = [a.decode(errors="replace") for a in argv]
            if ppid == self.proc.pid and all(any(m in w for w in words) for m in marks):
                return int(entry.name)
        raise AssertionError(f"no child of tiergate up with {marks}:\n{self.tail()}")


def _config(model: str, ports: dict[str, int]) -> dict[str, Any]:
    # The standard engine eager (a quick start); the fast one tuned, as make up's is, by a
    # real tuning reduced to the session's lossless recipe, one level and ten parity tasks
    # (minutes less than the default's), screened as served (compiled) beside the running
    # standard engine; its own engine whatever the verdict, so that there is one to kill.
    return {
        "gateway": {"port": ports["gateway"], "metrics_port": ports["metrics"]},
        "tiers": {
            "standard": {"endpoints": [f"http://127.0.0.1:{ports['standard']}"]},
            "fast": {"endpoints": [f"http://127.0.0.1:{ports['fast']}"]},
        },
        "profiles": {
            "standard": {
                "model": model,
                "port": ports["standard"],
                "cpu_cores": "0",
                "enforce_eager": True,
            },
            "fast": {"model": model, "port": ports["fast"], "cpu_cores": "1", "tuned": True},
        },
        "tuning": {
            "candidates": [FAST_RECIPE.model_dump(mode="json")],
            "levels": [1],
            "requests_per_level": 2,
            "rounds": 1,
            "max_tokens": 16,
            "parity_max_tasks": 10,
            "screen_eager": False,
            "share_engines_when_equal": False,
        },
        "health": {"interval_seconds": 0.5, "cooldown_seconds": 2},
        "timeouts": {"first_byte_seconds": 120},
        "local": {
            "s3_port": ports["s3"],
            "broker_port": ports["broker"],
            "worker_health_port": ports["worker"],
        },
        "jobs": {"worker": {"concurrency": 1}},
    }


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    settings = load_settings()
    model = str(prepare_profile_model(settings.profiles[Tier.STANDARD], settings))
    names = ("gateway", "metrics", "standard", "fast", "s3", "broker", "worker")
    ports = {name: free_port() for name in names}
    config = tmp_path / "tiergate.yaml"
    config.write_text(yaml.safe_dump(_config(model, ports)))
    env = {
        **os.environ,
        "TIERGATE_CONFIG": str(config),
        "TIERGATE_CACHE_DIR": str(tmp_path / "cache"),
    }
    made = Stack(env, tmp_path / "up.log", f"http://127.0.0.1:{ports['gateway']}", ports)
    try:
        yield made
    finally:
        if made.proc is not None and made.proc.poll() is None:
            made.proc.send_signal(signal.SIGINT)
            try:
                made.proc.wait(180)
            except subprocess.TimeoutExpired:
                made.proc.kill()


def _chat(base: str, tier: str, stream: bool = False) -> httpx.Response:
    body = {
        "model": MODEL,
        "service_tier": tier,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hello"}],
        "stream": stream,
    }
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def _said(stack: Stack, *parts: str) -> Callable[[], bool]:
    return lambda: any(all(p in line for p in parts) for line in stack.said().splitlines())


def _job(base: str, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30)
    assert answer.status_code == 200, f"job {job_id}: {answer.status_code} {answer.text}"
    got: dict[str, Any] = answer.json()
    return got


def _ended(base: str, job_id: str) -> bool:
    return _job(base, job_id)["status"] in TERMINAL


@pytest.mark.e2e
def test_make_ups_stack_restarts_what_dies_and_resumes_on_its_data(stack: Stack) -> None:
    stack.start()
    stack.wait_serving()
    base = stack.base

    # It serves as soon as the standard engine does (issue 53): the fast tier's requests go
    # to the standard tier, saying why, while the fast engine starts (compiled: minutes);
    # then it joins the running gateway. Requests sent throughout: every one answered.
    served: list[tuple[str, str]] = []
    progress: list[str] = []

    def joined() -> bool:
        answer = _chat(base, "priority", stream=len(served) % 2 == 1)
        assert answer.status_code == 200, f"{answer.status_code} {answer.text}"
        served.append((answer.headers["x-tiergate-tier"], answer.headers["x-tiergate-tier-reason"]))
        fast = next(t for t in httpx.get(f"{base}/v1/tiers").json()["data"] if t["tier"] == "fast")
        if "fitting" in fast:
            progress.append(fast["fitting"]["state"])
        return served[-1][0] == "fast" and "fitting" not in fast

    eventually(joined, READY_SECONDS, 0.5, lambda: f"fast joined ({served}):\n{stack.tail()}")
    assert served[0] == ("standard", "fitting"), served
    assert "tuning" in progress and "starting" in progress, progress
    assert progress.index("tuning") < progress.index("starting"), progress
    # The tuning ran as its own child, beside the serving gateway, and decided.
    assert _said(stack, "[tiergate tune] decision:")()
    assert _said(stack, "the fast tier joins the gateway")()
    cache = Path(stack.env["TIERGATE_CACHE_DIR"])
    decision = TierDecision.load(cache / "models" / "tier-decision.json")
    assert decision is not None and decision.phase_seconds.get("speed", 0) > 0, decision
    tiers = httpx.get(f"{base}/v1/tiers").json()  # the evidence, shown once it joined
    assert tiers["decision"]["decided_at"] == decision.decided_at, tiers
    shown_fast = next(t for t in tiers["data"] if t["tier"] == "fast")
    assert shown_fast["runs"] == decision.recipe_name, shown_fast

    # Compiled, as make up serves: said by /v1/tiers and by the engine's own command line.
    modes = httpx.get(f"{base}/v1/tiers").json()
    shown = {t["tier"]: t.get("engine_mode") for t in modes["data"]}
    assert shown == {"standard": "eager", "fast": "compiled"}, modes
    fast_pid = stack.child("--port", str(stack.ports["fast"]))
    fast_argv = Path(f"/proc/{fast_pid}/cmdline").read_bytes().split(b"\0")
    assert b"--enforce-eager" not in fast_argv
    # Tenants' jobs, uploads and batches, and the logs that quote them: root's alone.
    for private in (cache / "pipeline", cache / "logs"):
        assert private.stat().st_mode & 0o777 == 0o700, private
    for stream in (False, True):
        answer = _chat(base, "priority", stream)
        assert answer.status_code == 200 and answer.headers["x-tiergate-tier"] == "fast"

    # The fast engine SIGKILLed: its requests fall back to the standard tier, every one
    # answered, until the supervisor's restart serves them on the fast tier again.
    os.kill(fast_pid, signal.SIGKILL)
    eventually(_said(stack, "fast engine exited", "signal 9"), 30, 0.2, stack.tail)
    tiers_served: list[str] = []

    def fast_again() -> bool:
        answer = _chat(base, "priority")
        assert answer.status_code == 200, answer.text
        tiers_served.append(answer.headers["x-tiergate-tier"])
        if answer.headers["x-tiergate-tier"] == "standard":
            assert answer.headers["x-tiergate-fallback"] == "true"
            assert answer.json()["service_tier"] == "default"
        return tiers_served[-1] == "fast"

    eventually(
        fast_again, READY_SECONDS, 0.5, lambda: f"fast again ({tiers_served}):\n{stack.tail()}"
    )
    assert "standard" in tiers_served, tiers_served  # it fell back while the engine was down
    assert _said(stack, "fast engine restarted")()
    assert stack.child("--port", str(stack.ports["fast"])) != fast_pid

    # The worker, then the broker, SIGKILLed: each is restarted, and a job sent afterwards
    # runs to its end.
    for name, marks in (("job worker", ("tiergate", "worker")), ("broker", ("tansu",))):
        pid = stack.child(*marks)
        os.kill(pid, signal.SIGKILL)
        eventually(_said(stack, name, "restarted"), 120, 0.2, stack.tail)
    first = httpx.post(f"{base}/v1/jobs", json=JOB, timeout=30)
    assert first.status_code == 200, first.text
    eventually(lambda: _ended(base, first.json()["id"]), 600, 1.0, stack.tail)

    # Three jobs sent, one slot: the stack stopped while some are still queued.
    ids = []
    for n in range(3):
        sent = httpx.post(f"{base}/v1/jobs", json={**JOB, "metadata": {"n": str(n)}}, timeout=30)
        assert sent.status_code == 200, sent.text
        ids.append(sent.json()["id"])
    before = {i: _job(base, i)["status"] for i in ids}
    assert "queued" in before.values(), before
    stopped_at = time.monotonic()
    assert stack.stop() == 0, stack.tail()
    for port in (stack.ports["gateway"], stack.ports["s3"], stack.ports["broker"]):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    assert time.monotonic() - stopped_at < 180

    # Started again on the same data directory: every job of before ends, with a result,
    # and the first one is still there as it ended.
    stack.start()
    stack.wait_serving()
    for job_id in ids:
        eventually(lambda j=job_id: _ended(base, j), 600, 1.0, stack.tail)
        assert _job(base, job_id)["result"] is not None, _job(base, job_id)
    again = _job(base, first.json()["id"])
    assert again["status"] in TERMINAL and again["result"] is not None, again
    listed = {j["id"] for j in httpx.get(f"{base}/v1/jobs?limit=20").json()["data"]}
    assert {first.json()["id"], *ids} <= listed
    assert stack.stop() == 0, stack.tail()

"""Environments (tiergate.envs) with the real tools: a root file system built by mmdebstrap
from Debian's archive, stored in a real S3 server (SeaweedFS), fetched and unpacked by a
worker taking jobs from Kafka (Tansu), and bound as the root of real bubblewrap sandboxes.

The test environment (minbase + jq) is built once and kept in
``~/.cache/tiergate/envs/test-<manifest digest>.tar``, so reruns (and CI, when that cache
survives) skip the ~30 s build; the reproducibility test builds it once more."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.envs import MANIFEST, cache_dir, cached_tar
from tests.jobs.unprivileged import NOBODY, delegated, start_worker
from tests.jobstack import JobsStack, jobs_stack
from tiergate.envs.build import Built, build
from tiergate.envs.registry import Registry
from tiergate.objectstore import ObjectStore

TERMINAL = ("completed", "failed", "cancelled", "incomplete")
PROBE = "jq --version; git --version; curl --version; cat /etc/tiergate-env"


def _trajectory(job: dict[str, Any]) -> list[dict[str, Any]]:
    text = httpx.get(job["artifacts"]["trajectory"]).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _probe_job(stack: JobsStack, environment: str) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "instruction": "Probe the environment.",
        "environment": environment,
        "setup": ["jq --version", "test -f /etc/tiergate-env"],
        "limits": {"max_steps": 5, "timeout_seconds": 60},
    }
    return stack.submit(body)


def test_reproducible_build_gives_one_digest(built_env: Built, tmp_path: Path) -> None:
    """Two builds of one manifest, against the same state of the mirror, give one digest.
    If the cached tar is older than the mirror's last update (Debian published since), a
    fresh build differs from it: then two fresh builds are compared, and the cache renewed."""
    again = build(MANIFEST, tmp_path / "again.tar")
    if again.digest != built_env.digest:
        third = build(MANIFEST, tmp_path / "third.tar")
        assert third.digest == again.digest, "two builds of one manifest gave two digests"
        shutil.copyfile(again.path, cached_tar())
    assert again.bytes > 10_000_000


def test_job_runs_in_the_environment_and_records_its_digest(
    built_env: Built, broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [f"```bash\n{PROBE}\n```", "DONE"]
    jobs = {"sandbox": {"cache_dir": cache_dir()}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        entry = Registry(ObjectStore(stack.jobs.storage)).register(built_env)
        assert entry.digest == built_env.digest
        assert [e.name for e in Registry(ObjectStore(stack.jobs.storage)).list()] == ["test-jq"]
        stack.start_worker()
        job = _probe_job(stack, "test-jq")
        done = stack.wait(job["id"], lambda j: j["status"] in TERMINAL, timeout=120)
        assert done["status"] == "completed", done
        assert done["environment_digest"] == built_env.digest
        commands = [t for t in _trajectory(done) if t["type"] == "command"]
        output = commands[0]["output"]
        assert "jq-1.6" in output and "test" in output.splitlines(), output
        # The worker has git and curl; the environment has not: the shell says 127.
        assert "git: not found" in output and "curl: not found" in output, output
        assert commands[0]["exit_code"] == 0  # the last command (cat) succeeded
        unpacked = Path(stack.jobs.sandbox.cache_dir) / "envs" / built_env.digest / "rootfs"
        assert (unpacked / "usr/bin/jq").exists() and not (unpacked / "usr/bin/git").exists()

        # Exit statuses one by one, and the worker's own root for "default" (unregistered).
        model.behaviour.replies = [
            "```bash\ngit --version\n```",
            "```bash\ncurl --version\n```",
            "```bash\njq --version\n```",
            "DONE",
        ]
        second = stack.wait(
            _probe_job(stack, "test-jq")["id"], lambda j: j["status"] in TERMINAL, timeout=120
        )
        codes = [t["exit_code"] for t in _trajectory(second) if t["type"] == "command"]
        assert codes == [127, 127, 0], codes

        model.behaviour.replies = ["```bash\ngit --version\n```", "DONE"]
        default = stack.submit(
            {"model": MODEL, "instruction": "x", "limits": {"max_steps": 3, "timeout_seconds": 60}}
        )
        default = stack.wait(default["id"], lambda j: j["status"] in TERMINAL, timeout=120)
        assert default["status"] == "completed" and default["environment_digest"] is None
        codes = [t["exit_code"] for t in _trajectory(default) if t["type"] == "command"]
        assert codes == [0], "the default job runs in the worker's own system, which has git"

        missing = stack.wait(
            _probe_job(stack, "no-such-env")["id"], lambda j: j["status"] in TERMINAL
        )
        assert missing["status"] == "failed", missing
        assert missing["error"]["code"] == "environment_not_found", missing

        # A replay runs in the original's digest and says so.
        resp = httpx.post(f"{stack.base}/v1/jobs/{second['id']}/replay")
        assert resp.status_code == 200, resp.text
        replay = stack.wait(resp.json()["id"], lambda j: j["status"] in TERMINAL, timeout=120)
        assert replay["status"] == "completed", replay
        assert replay["environment_digest"] == built_env.digest
        assert replay["replay"]["environment_digest"] == built_env.digest
        assert replay["replay"]["matches"] is True, replay["replay"]


def test_unprivileged_worker_uses_a_cached_environment(
    built_env: Built, broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """A worker as uid 65534 fetches, unpacks and runs in the environment (building needs
    root; using it does not)."""
    model.behaviour.replies = [f"```bash\n{PROBE}\n```", "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        Registry(ObjectStore(stack.jobs.storage)).register(built_env)
        job = _probe_job(stack, "test-jq")
        with delegated(stack.jobs) as unprivileged:
            unprivileged.sandbox.cache_dir = cache_dir(NOBODY)
            log = tmp_path / "worker.log"
            worker = start_worker(unprivileged, log)
            try:
                done = stack.wait(job["id"], lambda j: j["status"] in TERMINAL, timeout=180)
            finally:
                worker.terminate()
                worker.wait(30)
        assert done["status"] == "completed", (done.get("error"), log.read_text()[-3000:])
        assert done["environment_digest"] == built_env.digest
        output = next(t for t in _trajectory(done) if t["type"] == "command")["output"]
        assert "jq-1.6" in output and "git: not found" in output, output

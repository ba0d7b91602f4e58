"""Hostile and broken jobs end (or are refused at submit), and nothing else stops: the
partition moves on, the worker (running as the image's unprivileged user) survives, and
a normal job submitted after them completes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.archives import tar_of
from tests.jobs.unprivileged import delegated, memory_capped, start_worker
from tests.jobstack import jobs_stack
from tests.servers import free_port

NORMAL: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Write ok into ok.txt.",
    "verifier": {"command": "test -f ok.txt"},
    "limits": {"max_steps": 3, "timeout_seconds": 60},
}
TERMINAL = ("completed", "failed", "cancelled", "incomplete")


def test_malformed_jobs_are_refused_at_submit(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        url = f"{stack.base}/v1/jobs"
        cases = [
            ({**NORMAL, "setup": ["echo a\x00b"]}, "setup"),
            ({**NORMAL, "verifier": {"command": "test\x00 -f x"}}, "verifier"),
            ({**NORMAL, "workspace": {"files": {"a": "x", "a/b": "y"}}}, "workspace"),
            ({**NORMAL, "workspace": {"files": {"a\x00b": "x"}}}, "workspace"),
            ({**NORMAL, "workspace": {"url": "s3://other-bucket/secret.tar"}}, "workspace.url"),
            ({**NORMAL, "workspace": {"upload_id": "upl_" + "0" * 32}}, "workspace.upload_id"),
            ({**NORMAL, "limits": {"memory_mb": 10**6}}, "limits.memory_mb"),
        ]
        for body, param in cases:
            resp = httpx.post(url, json=body)
            assert resp.status_code == 400, (body, resp.text)
            error = resp.json()["error"]
            assert error["param"] == param, error
            assert "other-bucket" not in error["message"]
        assert httpx.get(url).json()["data"] == []


def test_hostile_jobs_end_and_the_next_job_completes(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\necho ok > ok.txt\n```", "DONE"]
    health = free_port()
    # Two slots: the normal job may run beside a hostile one.
    with jobs_stack(
        broker, s3, model, tmp_path, jobs={"kafka": {"partitions": 2}}, worker={"concurrency": 2}
    ) as stack:
        jobs = stack.jobs.model_copy(deep=True)
        jobs.worker.metrics_host = "127.0.0.1"
        jobs.worker.metrics_port = health
        # Not a tar: refused at upload now (tests/jobs/test_tenant_costs.py), nothing stored.
        upload = httpx.post(f"{stack.base}/v1/jobs/workspaces", content=b"not a tar at all")
        assert upload.status_code == 400, upload.text
        assert upload.json()["error"]["code"] == "invalid_upload"
        nested = httpx.post(
            f"{stack.base}/v1/jobs/workspaces", content=tar_of({"a": b"x", "a/b": b"y"})
        ).json()["id"]
        small = {"max_steps": 2, "timeout_seconds": 20, "memory_mb": 64, "disk_mb": 8}
        hostile = {
            "file and directory": {"workspace": {"upload_id": nested}},
            "memory bomb": {"setup": ["python3 -c 'b = bytearray(512 * 1024 * 1024)'"]},
            # A bomb dash runs (it refuses a function named `:`, so the classic one is a
            # syntax error, and bombed nothing); the setup then fails after it.
            "fork bomb": {
                "setup": ["bomb() { bomb | bomb & }; bomb; sleep 1; exit 1"],
                "limits": {**small, "timeout_seconds": 8},
            },
            "output bomb": {"setup": ["head -c 2000000000 /dev/zero | tr '\\0' x"]},
            "disk bomb": {"setup": ["head -c 100000000 /dev/zero > big"]},
            # Files each under the file size limit, together over the disk limit; then
            # empty files, which cost inodes: both stopped while the command runs.
            "many files bomb": {
                "setup": ["i=0; while :; do head -c 4000000 /dev/zero > f$i; i=$((i+1)); done"]
            },
            "inode bomb": {
                # A generator, not a list: memory stays flat, so the inode watcher stops it
                # (a list of 10**7 reached the 64 MiB memory limit first on a slow run).
                "setup": ["python3 -c \"any(open(f'f{i}', 'w').close() for i in range(10**7))\""]
            },
        }
        ids = {}
        for name, extra in hostile.items():
            body = {**NORMAL, "limits": small, **extra}
            ids[name] = stack.submit(body)["id"]
        normal = stack.submit(NORMAL)["id"]

        with delegated(jobs) as unprivileged:
            worker = start_worker(unprivileged, tmp_path / "worker.log")
            # The worker in a 2 GiB memory cgroup, as a pod's limit would hold it: it must
            # come through every hostile job alive.
            with memory_capped(worker, unprivileged, 2048):
                done = stack.wait(normal, lambda j: j["status"] in TERMINAL, timeout=240)
                assert done["status"] == "completed", (done, (tmp_path / "worker.log").read_text())
                finals = {
                    name: stack.wait(i, lambda j: j["status"] in TERMINAL, timeout=240)
                    for name, i in ids.items()
                }
                assert worker.poll() is None, "the worker died"
                assert httpx.get(f"http://127.0.0.1:{health}/healthz").status_code == 200
                metrics = httpx.get(f"http://127.0.0.1:{health}/metrics").text
                worker.terminate()
                worker.wait(30)
        many = finals["many files bomb"]["error"]["message"]
        assert "the command was stopped" in many and "disk limit" in many, many
        inodes = finals["inode bomb"]["error"]["message"]
        # Stopped by the disk watcher (inodes, or their 4 KiB blocks), or, when the watcher
        # is slower than the bomb on a loaded machine, by the job's own memory limit: the
        # kernel charges the inodes' memory to the job's cgroup (exit status 137).
        assert ("the command was stopped" in inodes) or ("(137)" in inodes), inodes
        assert any(w in inodes for w in ("files and directories", "disk limit", "(137)")), inodes
        failing = ("file and directory", "memory bomb", "fork bomb", "disk bomb")
        for name in (*failing, "many files bomb", "inode bomb"):
            assert finals[name]["status"] == "failed", (name, finals[name])
            assert finals[name]["error"]["code"] == "sandbox", (name, finals[name])
        # The output bomb's command succeeded; what came back of it was bounded.
        assert finals["output bomb"]["status"] == "completed", finals["output bomb"]
        trajectory = httpx.get(finals["output bomb"]["artifacts"]["trajectory"]).text
        assert "characters cut" in trajectory and len(trajectory) < 50_000
        events = httpx.get(f"{stack.base}/v1/jobs/{ids['memory bomb']}/events").text
        assert "job.failed" in events
        assert 'tiergate_jobs_finished_total{reason="sandbox",status="failed"} 6.0' in metrics
        assert 'tiergate_jobs_finished_total{reason="ok",status="completed"} 2.0' in metrics
        assert 'tiergate_jobs_sandbox_seconds_count{phase="setup"} 6.0' in metrics
        steps = sum(j["steps"] for j in finals.values()) + done["steps"]
        assert f"tiergate_jobs_step_seconds_count {float(steps)}" in metrics

"""Replay (issue 11, part 4): a finished job's recorded commands run again without the
model, by a worker, in a fresh bubblewrap sandbox from the same initial workspace, against
the real job stack (Kafka on Tansu, S3 on SeaweedFS), FakeVllm as the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import JobsStack, jobs_stack
from tiergate.jobsclient import JobsClient

TIERGATE = Path(sys.executable).with_name("tiergate")
DETERMINISTIC = [
    "```bash\necho hi > a.txt\n```",
    "```bash\ncat a.txt\n```",
    "```bash\nls\n```",
    "DONE",
]
NONDETERMINISTIC = [
    "```bash\necho one\n```",
    "```bash\ndate +%s%N\n```",
    "```bash\necho two\n```",
    "DONE",
]
TASK: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Write hi into a.txt.",
    "workspace": {"files": {"README.md": "the task\n"}},
    "setup": ["echo ready > setup.txt && echo set up"],
    "verifier": {
        "command": 'test "$(cat a.txt)" = hi && echo 1 > reward.txt && echo verified',
        "reward_file": "reward.txt",
    },
    "limits": {"max_steps": 6, "timeout_seconds": 60},
}


def _terminal(job: dict[str, Any]) -> bool:
    return job["status"] not in ("queued", "in_progress")


@pytest.fixture
def stack(broker: str, s3: str, model: FakeVllm, tmp_path: Path) -> Iterator[JobsStack]:
    with jobs_stack(broker, s3, model, tmp_path) as running:
        yield running


def _finished(stack: JobsStack, model: FakeVllm, replies: list[str], **spec: Any) -> str:
    model.behaviour.replies = list(replies)
    job = stack.submit({**TASK, **spec})
    done = stack.wait(job["id"], _terminal, timeout=90)
    assert done["status"] == "completed", done
    return str(job["id"])


def _replayed(stack: JobsStack, job_id: str) -> dict[str, Any]:
    resp = httpx.post(f"{stack.base}/v1/jobs/{job_id}/replay")
    assert resp.status_code == 200, resp.text
    queued = resp.json()
    assert queued["kind"] == "replay" and queued["replay_of"] == job_id
    assert queued["id"] != job_id and queued["status"] == "queued"
    return stack.wait(queued["id"], _terminal, timeout=90)


def _cli(*args: str, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TIERGATE), "jobs", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TIERGATE_BASE_URL": base},
        timeout=150,
    )


def test_a_deterministic_job_replays_step_for_step(stack: JobsStack, model: FakeVllm) -> None:
    stack.start_worker()
    original = _finished(stack, model, DETERMINISTIC)
    calls = len(model.record.bodies)

    done = _replayed(stack, original)
    assert done["status"] == "completed", done
    report = done["replay"]
    assert report["original"] == original and report["environment"] == "default"
    assert report["matches"] is True, report
    assert [s["index"] for s in report["steps"]] == [1, 2, 3]
    assert [s["command"] for s in report["steps"]] == ["echo hi > a.txt", "cat a.txt", "ls"]
    for step in report["steps"]:
        assert step["exit_matches"] and step["output_matches"], step
        assert step["exit_code"] == {"recorded": 0, "replayed": 0}
        assert step["output"] is None  # both outputs kept only when they differ
        assert step["seconds"]["recorded"] is not None and step["seconds"]["replayed"] >= 0
    assert report["setup"][0]["command"] == TASK["setup"][0]
    assert report["setup"][0]["output_matches"] is True
    verifier = report["verifier"]
    assert verifier["matches"] is True
    assert verifier["passed"] == {"recorded": True, "replayed": True}
    assert verifier["reward"] == {"recorded": 1.0, "replayed": 1.0}
    assert done["result"] == {
        "passed": True,
        "reward": 1.0,
        "rewards": None,
        "verifier_exit_code": 0,
    }
    assert done["steps"] == 3
    # Without the model: not one more chat completion.
    assert len(model.record.bodies) == calls

    # The replayed trajectory, the workspace and the report (in the terminal record) are
    # the replay's own artifacts.
    assert {"trajectory", "workspace", "verifier_log", "result"} <= set(done["artifacts"])
    lines = httpx.get(done["artifacts"]["trajectory"]).text.splitlines()
    replayed = [json.loads(line) for line in lines]
    assert [e["output"] for e in replayed if e["type"] == "command"][1] == "hi\n"
    record = json.loads(httpx.get(done["artifacts"]["result"]).text)
    assert record["replay"]["matches"] is True and record["kind"] == "replay"
    assert httpx.get(done["artifacts"]["verifier_log"]).text == "verified\n"

    # Through the typed client.
    with JobsClient(stack.base) as client:
        queued = client.replay(original)
        assert queued.kind == "replay" and queued.replay_of == original
        final = client.wait(queued.id, timeout=90)
        assert final.replay is not None and final.replay.matches
        assert [s.exit_matches for s in final.replay.steps] == [True, True, True]

    # Through the CLI: progress on stderr, the replay job on stdout, exit 0 (all matched).
    cli = _cli("replay", original, "--wait", "--timeout", "90", base=stack.base)
    assert cli.returncode == 0, cli.stderr
    job = json.loads(cli.stdout)
    assert job["kind"] == "replay" and job["replay"]["matches"] is True
    progress = cli.stderr.splitlines()
    assert progress[0] == f"[{job['id']}] replaying {original}"
    assert f"[{job['id']}] step 2: cat a.txt (exit 0)" in progress
    assert progress[-1] == f"[{job['id']}] completed: matches=true"
    assert len(model.record.bodies) == calls


def test_a_nondeterministic_step_does_not_match_and_unfinished_jobs_are_refused(
    stack: JobsStack, model: FakeVllm
) -> None:
    # Before any worker runs: the job stays queued, and a replay of it is a 409.
    model.behaviour.replies = list(NONDETERMINISTIC)
    queued = stack.submit(TASK)
    resp = httpx.post(f"{stack.base}/v1/jobs/{queued['id']}/replay")
    assert resp.status_code == 409, resp.text
    error = resp.json()["error"]
    assert error["code"] == "job_not_finished" and error["param"] == "job_id"
    assert "queued" in error["message"]
    # A cancelled job cannot be replayed either; an unknown one is a 404 as for get.
    assert httpx.post(f"{stack.base}/v1/jobs/{queued['id']}/cancel").json()["status"] == (
        "cancelled"
    )
    resp = httpx.post(f"{stack.base}/v1/jobs/{queued['id']}/replay")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "job_not_replayable"
    resp = httpx.post(f"{stack.base}/v1/jobs/job_nope/replay")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "job_not_found"

    stack.start_worker()
    original = _finished(stack, model, NONDETERMINISTIC, verifier=None)
    done = _replayed(stack, original)
    assert done["status"] == "completed", done
    report = done["replay"]
    assert report["matches"] is False and report["verifier"] is None
    assert [s["command"] for s in report["steps"]] == ["echo one", "date +%s%N", "echo two"]
    assert [s["output_matches"] for s in report["steps"]] == [True, False, True]
    assert [s["exit_matches"] for s in report["steps"]] == [True, True, True]
    clock = report["steps"][1]["output"]
    assert clock["recorded"] != clock["replayed"]
    assert int(clock["replayed"]) > int(clock["recorded"])  # nanoseconds, later

    # The CLI says so with exit status 1.
    cli = _cli("replay", original, "--wait", "--timeout", "90", base=stack.base)
    assert cli.returncode == 1, cli.stderr
    assert json.loads(cli.stdout)["replay"]["matches"] is False
    assert cli.stderr.splitlines()[-1].endswith("completed: matches=false")

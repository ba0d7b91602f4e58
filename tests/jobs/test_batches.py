"""Rollout batches end to end (real broker, object store and sandbox; the model is the
fake, and each task's workspace says what its one command does): a batch of three domains
completes with per-domain figures and an export that TRL and the model's chat template
read; domains share the slots by weight while one's tasks take ten times longer; saturated
tasks get no later round; a domain whose environment is broken is taken out while the
others finish; cancel and the budget hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import JobsStack, jobs_stack
from tests.readme_blocks import run_readme_block
from tests.waiting import eventually
from tiergate.jobsclient import JobsClient
from tiergate.settings import DEFAULT_MODEL_NAME

REPLY = "```bash\nsh task.sh\n```"


def task(domain: str, task_id: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instruction": f"solve {task_id}",
        "domain": domain,
        "task_id": task_id,
        "limits": {"max_steps": 1},
        "workspace": {"files": {"task.sh": script}},
        "verifier": {"command": "test -f ok"},
        **extra,
    }


# Passes on even samples only: the sample's number is not known to the job, so it flips a
# coin from its own id (the sandbox's hostname is the same for all): a mixed task.
MIXED = "test $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 && touch ok; true"


def _stack(broker: str, s3: str, model: FakeVllm, tmp_path: Path, **worker: Any) -> Any:
    model.behaviour.replies = [REPLY]
    return jobs_stack(
        broker,
        s3,
        model,
        tmp_path,
        jobs={"batch_poll_seconds": 0.3},
        worker={"concurrency": 2, **worker},
    )


def _wait(stack: JobsStack, batch_id: str, timeout: float = 180) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = httpx.get(f"{stack.base}/v1/jobs/batches/{batch_id}").json()
        return body if body["status"] != "in_progress" and body["completed_at"] else None

    return eventually(done, timeout, 0.5, f"batch {batch_id} finished")


def test_a_batch_of_three_domains_completes_and_its_export_loads(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    tasks = [
        task("code", "fix-1", "touch ok"),
        task("code", "fix-2", "true"),
        task("terminal", "ls-1", "touch ok"),
        task("docs", "read-1", MIXED),
    ]
    with _stack(broker, s3, model, tmp_path) as stack:
        worker = stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=2, max_in_flight=4)
            final = client.wait_batch(batch.id, timeout=180, poll_seconds=0.5)
            rollouts = client.rollouts(batch.id)
        assert final.status == "completed"
        assert final.counts.get("incomplete", 0) + final.counts.get("completed", 0) == 8
        assert final.domains["code"]["tasks"]["fix-1"]["pass_rate"] == 1.0
        assert final.domains["code"]["tasks"]["fix-2"]["pass_rate"] == 0.0
        assert final.domains["code"]["pass_rate"] == 0.5
        # The batch's figures on the worker's /metrics: a domain's pass rate is passed / all.
        metrics = generate_latest(worker.metrics.registry).decode()
        assert 'tiergate_batch_rollouts_total{domain="code",outcome="passed"} 2.0' in metrics
        assert 'tiergate_batch_rollouts_total{domain="code",outcome="not_passed"} 2.0' in metrics
        assert 'tiergate_batch_queue_wait_seconds_count{domain="docs"} 2.0' in metrics
        assert len(rollouts) == 8
        first = rollouts[0]
        assert first["messages"][0]["role"] == "system" and first["model"] == MODEL
        assert first["completion"][0]["role"] == "assistant"
        assert "sh task.sh" in first["completion"][0]["content"]
        assert {r["domain"] for r in rollouts} == {"code", "terminal", "docs"}
        fix2 = [r for r in rollouts if r["task_id"] == "fix-2"]
        assert all(r["reward"] == 0.0 and r["advantage"] == 0.0 for r in fix2)
        # A reader of the format: TRL's own checks of conversational records, and loading
        # the file as a dataset as a trainer would (imported here: TRL loads torch).
        from datasets import load_dataset
        from trl.data_utils import is_conversational

        assert is_conversational(first)
        assert is_conversational({"prompt": first["prompt"], "completion": first["completion"]})
        path = tmp_path / "rollouts.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rollouts))
        dataset = load_dataset("json", data_files=str(path), split="train")
        assert len(dataset) == 8 and is_conversational(dataset[0])
        # The event stream: each rollout once, then the batch's end.
        with httpx.stream("GET", f"{stack.base}/v1/jobs/batches/{batch.id}/events") as events:
            lines = [line for line in events.iter_lines() if line.startswith("data: ")]
        kinds = [json.loads(line[6:])["type"] for line in lines[:-1]]
        assert kinds == ["batch.rollout"] * 8 + ["batch.completed"] and lines[-1] == "data: [DONE]"
        # Every job of the batch is an ordinary job of its owner.
        job = httpx.get(f"{stack.base}/v1/jobs/{first['job_id']}").json()
        assert job["metadata"]["batch_id"] == batch.id


def test_domains_share_the_slots_by_weight_while_one_takes_ten_times_longer(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    tasks = [task("slow", f"s{i}", "sleep 5; touch ok") for i in range(3)]
    tasks += [task("fast", f"f{i}", "touch ok") for i in range(12)]
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=1, max_in_flight=2)
            final = client.wait_batch(batch.id, timeout=240, poll_seconds=0.5)
        jobs = {
            r.job_id: httpx.get(f"{stack.base}/v1/jobs/{r.job_id}").json() for r in final.rollouts
        }
    spans = {
        r.domain: [
            (jobs[x.job_id]["started_at"], jobs[x.job_id]["completed_at"])
            for x in final.rollouts
            if x.domain == r.domain
        ]
        for r in final.rollouts
    }
    # While both domains had samples left (until the fast domain's last one started), each
    # held one of the two slots: the fast domain's jobs ran back to back beside the slow.
    fast_done = max(end for _, end in spans["fast"])
    slow_busy = sum(
        min(end, fast_done) - start for start, end in spans["slow"] if start < fast_done
    )
    window = fast_done - min(start for start, _ in spans["fast"] + spans["slow"])
    assert window > 0
    fast_busy = sum(end - start for start, end in spans["fast"])
    # Equal weights, two slots: each domain held one slot, half the slots' time (2 x the
    # window), within 25%; FIFO would have given the slow tasks both slots.
    assert 0.75 * window <= slow_busy <= window + 1, (slow_busy, window)
    assert 0.75 * window <= fast_busy + len(spans["fast"]), (fast_busy, window)
    assert final.status == "completed"


def test_saturated_tasks_get_no_second_round(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    tasks = [task("code", "always", "touch ok"), task("code", "never", "true")]
    tasks.append(task("code", "coin", MIXED))
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=3, rounds=2, max_in_flight=4)
            final = client.wait_batch(batch.id, timeout=240, poll_seconds=0.5)
    per_task = {t: [r for r in final.rollouts if r.task_id == t] for t in ("always", "never")}
    assert len(per_task["always"]) == 3 and len(per_task["never"]) == 3
    skipped = {s.task_id: s.detail for s in final.skips if s.reason == "saturated"}
    assert "all 3 samples passed" in skipped["always"]
    assert "all 3 samples failed" in skipped["never"]
    coin = [r for r in final.rollouts if r.task_id == "coin"]
    assert len(coin) in (3, 6)  # 6 unless its three coins all fell alike
    assert (len(coin) == 3) == ("coin" in skipped)


def test_a_domain_with_a_broken_environment_is_taken_out_and_the_rest_finishes(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    tasks = [task("broken", f"b{i}", "touch ok", environment="no-such-env") for i in range(4)]
    tasks += [task("fine", f"g{i}", "touch ok") for i in range(3)]
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=2, max_in_flight=4)
            final = client.wait_batch(batch.id, timeout=240, poll_seconds=0.5)
    assert "broken" in final.removed_domains
    assert final.domains["fine"]["counts"] == {"incomplete": 6}
    broken = [r for r in final.rollouts if r.domain == "broken"]
    assert len(broken) < 8  # taken out before all its samples ran
    assert any(s.reason == "domain_removed" for s in final.skips)


def test_cancel_and_budget(broker: str, s3: str, model: FakeVllm, tmp_path: Path) -> None:
    slow = [task("d", f"t{i}", "sleep 3; touch ok") for i in range(6)]
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        with JobsClient(stack.base) as client:
            budgeted = client.submit_batch(
                [task("d", f"q{i}", "touch ok") for i in range(5)],
                samples_per_task=2,
                budget={"max_jobs": 3},
                max_in_flight=8,
            )
            final = client.wait_batch(budgeted.id, timeout=120, poll_seconds=0.5)
            assert len(final.rollouts) == 3
            assert any(s.reason == "budget" for s in final.skips)
            batch = client.submit_batch(slow, samples_per_task=2, max_in_flight=4)
            eventually(
                lambda: any(r.status == "in_progress" for r in client.get_batch(batch.id).rollouts),
                60,
                0.3,
                "a job of the batch running",
            )
            client.cancel_batch(batch.id)
            final = client.wait_batch(batch.id, timeout=120, poll_seconds=0.5)
        assert final.status == "cancelled"
        assert len(final.rollouts) < 2 * len(slow)  # what had not started never did
        statuses = [r.status for r in final.rollouts]
        assert set(statuses) <= {"cancelled", "incomplete", "completed"}
        assert "cancelled" in statuses  # the queued ones (two slots, four in flight)


def test_the_readme_batch_example_runs_verbatim(broker: str, s3: str, tmp_path: Path) -> None:
    """As written, with a fake engine serving the README's model (tests/e2e runs the jobs
    examples on the real one)."""
    fake = FakeVllm(model=DEFAULT_MODEL_NAME).start()
    # One answer that does every task of the example (the fake gives each job the same).
    solve = (
        "echo hello > hello.txt; touch empty.txt; date > date.txt; ls /etc | wc -l > count.txt;"
        " head -1 README.md > title.txt; wc -l < README.md > lines.txt"
    )
    try:
        running = _stack(broker, s3, fake, tmp_path)
        fake.behaviour.replies = [f"```bash\n{solve}\n```"]
        with running as stack:
            stack.start_worker()
            done = run_readme_block("jobs-batch", stack.base, tmp_path, timeout=600)
    finally:
        fake.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "24 rollouts; conversational: True" in done.stdout
    assert "round 1: docs" in done.stderr  # the progress per domain
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert batch["status"] == "completed"
    assert {d: v["pass_rate"] for d, v in batch["domains"].items()} == {
        "files": 1.0,
        "shell": 1.0,
        "docs": 1.0,
    }

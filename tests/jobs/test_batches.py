"""Rollout batches end to end (real broker, object store and sandbox; the model is the
fake, and each task's workspace says what its one command does): a batch of three domains
completes with per-domain figures and an export that TRL and the model's chat template
read; domains share the slots by weight while one's tasks take ten times longer; saturated
tasks get no later round; a domain whose environment is broken is taken out while the
others finish; cancel and the budget hold."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import JobsStack, jobs_stack
from tests.readme_blocks import run_readme_block
from tests.waiting import eventually
from tiergate.enginesettings import DEFAULT_MODEL_NAME
from tiergate.jobs.batches.store import BatchStore
from tiergate.jobs.state.store import JobStore
from tiergate.jobsclient import JobsClient

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
    # window), within 25% and 1 s (a job's pickup, on a fast CPU a large part of a short
    # window); FIFO would have given the slow tasks both slots.
    assert 0.75 * window - 1 <= slow_busy <= window + 1, (slow_busy, window)
    assert 0.75 * window - 1 <= fast_busy + len(spans["fast"]), (fast_busy, window)
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


def _post_batch(stack: JobsStack, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{stack.base}/v1/jobs/batches", json=body, headers=headers, timeout=30)


def _active_batches(stack: JobsStack) -> list[tuple[str, str]]:
    return list(BatchStore(JobStore(stack.jobs.storage)).active())


def test_a_key_cannot_flood_the_schedulers_with_batches_nor_hold_back_another_key(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Every unfinished batch is read and scheduled by a worker each pass: one key's
    batches are capped (jobs.max_active_batches), an oversized batch is refused whole
    (jobs.max_batch_rollouts), and neither refusal records anything or touches the other
    key, whose batch is taken."""
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    one = {"tasks": [task("d", "t", "touch ok")], "samples_per_task": 1}
    with jobs_stack(
        broker,
        s3,
        model,
        tmp_path,
        auth=keys.auth,
        jobs={"max_active_batches": 2, "max_batch_rollouts": 50},
        worker={"api_key": keys.worker},
    ) as stack:  # no worker: the batches stay unfinished
        for _ in range(2):
            assert _post_batch(stack, one, mallory).status_code == 200
        refused = _post_batch(stack, one, mallory)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_batches"
        assert refused.headers["retry-after"]

        big = {"tasks": [task("d", f"t{i}", "touch ok") for i in range(13)], "samples_per_task": 4}
        too_big = _post_batch(stack, big, alice)  # 52 rollouts planned
        assert too_big.status_code == 400, too_big.text
        assert too_big.json()["error"]["code"] == "batch_too_large"
        assert too_big.json()["error"]["param"] == "budget.max_jobs"
        budgeted = _post_batch(stack, {**big, "budget": {"max_jobs": 50}}, alice)
        assert budgeted.status_code == 200, budgeted.text

        owners = sorted(owner for owner, _ in _active_batches(stack))
        assert owners == sorted([keys.owners["alice"], *[keys.owners["mallory"]] * 2])


def test_a_batch_naming_an_upload_the_key_does_not_hold_is_refused_and_records_nothing(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, worker={"api_key": keys.worker}
    ) as stack:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            data = b"secret of alice\n"
            info = tarfile.TarInfo("notes.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        upload = httpx.post(
            f"{stack.base}/v1/jobs/workspaces", content=archive.getvalue(), headers=alice
        )
        assert upload.status_code == 200, upload.text
        named = task("d", "steal", "cat notes.txt", workspace={"upload_id": upload.json()["id"]})
        theirs = _post_batch(stack, {"tasks": [named], "samples_per_task": 1}, mallory)
        assert theirs.status_code == 400, theirs.text
        error = theirs.json()["error"]
        assert (error["code"], error["param"]) == (
            "upload_not_found",
            "tasks.0.workspace.upload_id",
        )
        assert _active_batches(stack) == []
        ours = _post_batch(stack, {"tasks": [named], "samples_per_task": 1}, alice)
        assert ours.status_code == 200, ours.text


def test_a_batch_from_an_uploaded_tasks_file_runs_and_a_bad_file_is_refused_by_line(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("alice", "mallory")
    alice, mallory = keys.headers("alice"), keys.headers("mallory")
    lines = [json.dumps(task("d", f"t{i}", "touch ok")) for i in range(3)]
    good = ("# three tasks\n" + "\n".join(lines) + "\n\n").encode()
    bad = ("\n".join(lines[:2]) + '\n{"domain": "d", "task_id": "x"}\n').encode()
    model.behaviour.replies = [REPLY]
    with jobs_stack(
        broker,
        s3,
        model,
        tmp_path,
        auth=keys.auth,
        jobs={"batch_poll_seconds": 0.3},
        worker={"api_key": keys.worker, "concurrency": 2},
    ) as stack:
        url = f"{stack.base}/v1/jobs/batches/tasks"
        store = JobStore(stack.jobs.storage)
        refused = httpx.post(url, content=bad, headers=alice)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["message"].startswith("tasks file line 3: ")
        assert store.uploads(keys.owners["alice"]) == []  # a refused file stores nothing

        uploaded = httpx.post(url, content=good, headers=alice)
        assert uploaded.status_code == 200, uploaded.text
        answer = uploaded.json()
        assert (answer["object"], answer["tasks"]) == ("jobs.batch_tasks", 3)

        body = {"tasks_upload_id": answer["id"], "samples_per_task": 1}
        theirs = _post_batch(stack, body, mallory)
        assert theirs.status_code == 400, theirs.text
        assert theirs.json()["error"]["code"] == "upload_not_found"
        both = _post_batch(stack, {**body, "tasks": [task("d", "t9", "touch ok")]}, alice)
        assert both.status_code == 400, both.text

        stack.start_worker()
        created = _post_batch(stack, body, alice)
        assert created.status_code == 200, created.text
        final = eventually(
            lambda: (
                b
                if (
                    b := httpx.get(
                        f"{stack.base}/v1/jobs/batches/{created.json()['id']}", headers=alice
                    ).json()
                )["completed_at"]
                else None
            ),
            180,
            0.5,
            "the uploaded batch finished",
        )
        assert final["status"] == "completed"
        assert sorted(r["task_id"] for r in final["rollouts"]) == ["t0", "t1", "t2"]
        assert sum(final["counts"].get(s, 0) for s in ("completed", "incomplete")) == 3
        assert all(r["passed"] for r in final["rollouts"]), final["rollouts"]


def test_another_keys_batch_is_not_found_on_any_of_its_routes(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Attacker's test: every route of a rollout batch (read, its events, its groups and
    their events, its export, cancel, a policy version) answers another key 404, as if the
    batch did not exist, and changes nothing of it."""
    keys = tenants("alice", "mallory")
    alice, mallory = keys.headers("alice"), keys.headers("mallory")
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth) as stack:  # no worker
        url = f"{stack.base}/v1/jobs/batches"
        created = httpx.post(
            url, json={"tasks": [task("d", "t", "touch ok")], "samples_per_task": 1}, headers=alice
        )
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        attempts = [
            ("GET", ""),
            ("GET", "/events"),
            ("GET", "/groups"),
            ("GET", "/groups/events"),
            ("GET", "/rollouts"),
            ("POST", "/cancel"),
            ("POST", "/policy_version"),
        ]
        for method, path in attempts:
            body = {"version": 9} if path == "/policy_version" else None
            got = httpx.request(
                method, f"{url}/{batch_id}{path}", headers=mallory, json=body, timeout=30
            )
            assert got.status_code == 404, (path, got.status_code, got.text)
            assert got.json()["error"]["code"] == "batch_not_found", path
        mine = httpx.get(f"{url}/{batch_id}", headers=alice).json()
        assert (mine["status"], mine["policy_version"]) == ("in_progress", 0)
        groups = httpx.get(f"{url}/{batch_id}/groups", headers=alice)
        assert groups.status_code == 200 and groups.text == ""
        assert groups.headers["x-tiergate-batch-status"] == "in_progress"

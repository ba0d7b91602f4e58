"""A finished rollout as a trainer reads it: one JSON object a line.

The conversation is rebuilt from the job's trajectory exactly as the worker's agent loop
(tiergate.jobs.run.agent) sent it to the model: the system prompt, the instruction, then each
model turn as an ``assistant`` message (with its ``tool_calls`` under the tools protocol)
and each command's result as the next ``user`` message (``tool``, with its
``tool_call_id``, under the tools protocol). Two shapes of TRL's conversational datasets
are in every record: ``messages`` (conversational language modeling) and ``prompt`` /
``completion`` (conversational prompt-completion: the system and user messages, then the
rest), beside the rollout's figures: ``reward`` (raw), ``rewards`` (the verifier's named
rewards, when it wrote several; ``reward`` is their sum), ``reward_normalized`` (the group
z-score), ``advantage`` (``reward`` minus the group's mean), ``normalized_advantage``
(scaled per domain and clipped: what to train on), ``domain``, ``task_id``, ``sample``,
``environment_digest``, ``model``, ``service_tier`` (served), ``tokens`` and
``trajectory`` (the artifact's URL).
"""

from __future__ import annotations

import json
from typing import Any

from tiergate.jobs.state.store import JobStore
from tiergate.protocol.batches import BatchCreate, Rollout
from tiergate.protocol.prompts import TEXT_SYSTEM_PROMPT, TOOLS_SYSTEM_PROMPT

NO_COMMAND = (
    "No command found. Answer with one command in a ```bash block, or DONE if the task is complete."
)


def conversation(instruction: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a rollout, from its trajectory's entries."""
    tools = any(e.get("type") == "model" and e.get("tool_calls") for e in entries)
    system = TOOLS_SYSTEM_PROMPT if tools else TEXT_SYSTEM_PROMPT
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": instruction},
    ]
    turns = [e for e in entries if e.get("type") in ("model", "command")]
    for index, entry in enumerate(turns):
        if entry["type"] != "model":
            continue
        following = turns[index + 1] if index + 1 < len(turns) else None
        calls = entry.get("tool_calls") or None
        assistant: dict[str, Any] = {"role": "assistant", "content": entry.get("content") or ""}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if following is not None and following["type"] == "command":
            feedback = f"exit status {following['exit_code']}\n{following['output']}"
            if calls:
                messages.append(
                    {"role": "tool", "tool_call_id": calls[0].get("id"), "content": feedback}
                )
            else:
                messages.append({"role": "user", "content": feedback})
        elif following is not None:
            messages.append({"role": "user", "content": NO_COMMAND})
    return messages


def rollout_record(store: JobStore, spec: BatchCreate | None, rollout: Rollout) -> dict[str, Any]:
    job = store.get(rollout.job_id)
    run = job.run if job is not None else None
    raw = store.read_artifact(rollout.job_id, "trajectory", run)
    entries = [
        json.loads(line)
        for line in (raw or b"").decode(errors="replace").splitlines()
        if line.strip()
    ]
    task = next(
        (
            t
            for t in (spec.tasks if spec else [])
            if t.domain == rollout.domain and t.task_id == rollout.task_id
        ),
        None,
    )
    messages = conversation(task.instruction if task else "", entries)
    urls = store.artifact_urls(rollout.job_id, run)
    return {
        "messages": messages,
        "prompt": messages[:2],
        "completion": messages[2:],
        "reward": rollout.reward,
        "rewards": rollout.rewards,
        "reward_normalized": rollout.reward_normalized,
        "advantage": rollout.advantage,
        "normalized_advantage": rollout.normalized_advantage,
        "passed": rollout.passed,
        "domain": rollout.domain,
        "task_id": rollout.task_id,
        "sample": rollout.sample,
        "round": rollout.round,
        "job_id": rollout.job_id,
        "environment_digest": rollout.environment_digest,
        "model": task.model if task else (job.model if job else None),
        "service_tier": rollout.service_tier,
        "tokens": rollout.tokens,
        "trajectory": urls.get("trajectory"),
    }

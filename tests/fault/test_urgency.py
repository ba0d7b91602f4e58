"""Urgency (issue 23, item 4): a request's place where requests share a queue. With
``policy.engine_priorities`` the gateway sets vLLM's ``priority`` from what was asked
(``priority`` 0, default 1, ``flex`` 2) and puts an agent job's calls last (2, whatever
tier the job asked for); a caller's own ``priority`` never reaches the engine. In a tier's
admission queue the same order holds: a ``flex`` request queued first is admitted after
a default one queued later."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.access.gate import Gate
from tiergate.gateway.access.gatekeeper import admission_rank
from tiergate.tiers import DEFAULT_URGENCY, FLEX_URGENCY, JOB_URGENCY, PRIORITY_URGENCY

CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _sent(fake: FakeVllm) -> Any:
    return fake.record.bodies[-1].get("priority", "absent")


def test_the_engine_priority_follows_the_asked_tier_and_jobs_go_last(
    fakes: list[FakeVllm],
) -> None:
    keys = tenants("alice")
    worker = {
        "authorization": f"Bearer {keys.worker}",
        "x-tiergate-on-behalf-of": keys.owners["alice"],
    }
    alice = keys.headers("alice")
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], policy={"engine_priorities": True}, auth=keys.auth
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"

        def send(headers: dict[str, str], **body: Any) -> None:
            resp = httpx.post(url, json={**CHAT, **body}, headers=headers, timeout=10)
            assert resp.status_code == 200, resp.text

        send(alice, service_tier="priority")
        assert _sent(fakes[2]) == PRIORITY_URGENCY
        send(alice)
        assert _sent(fakes[0]) == DEFAULT_URGENCY
        send(alice, service_tier="flex", priority=-100)  # its own priority is dropped
        assert _sent(fakes[0]) == FLEX_URGENCY
        send(worker, service_tier="priority")  # a job's call: its tier, the last place
        assert _sent(fakes[2]) == JOB_URGENCY
        scheduling = httpx.get(f"{base}/v1/tiers", headers=alice).json()["scheduling"]
        assert scheduling["engine_priorities"] is True
        assert scheduling["urgency"]["agent_jobs"] == JOB_URGENCY

    off = gateway_settings([fakes[0].url], [fakes[2].url])
    with running_gateway(off) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "priority": -5})
        assert resp.status_code == 200, resp.text
        assert _sent(fakes[0]) == "absent"  # engines without priority scheduling: none sent


def test_a_flex_request_queued_first_is_admitted_after_a_default_one() -> None:
    async def scenario() -> list[str]:
        gate = Gate(capacity=1, max_queue=8)
        await gate.enter(0, 1.0)  # the slot is taken
        order: list[str] = []

        async def wait(name: str, urgency: int, key_priority: int = 0) -> None:
            await gate.enter(admission_rank(key_priority, urgency), 5.0)
            order.append(name)
            gate.leave()

        waiters = [asyncio.create_task(wait("flex", FLEX_URGENCY, key_priority=9))]
        await asyncio.sleep(0.01)
        waiters.append(asyncio.create_task(wait("default", DEFAULT_URGENCY)))
        await asyncio.sleep(0.01)
        waiters.append(asyncio.create_task(wait("priority", PRIORITY_URGENCY)))
        await asyncio.sleep(0.01)
        gate.leave()
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["priority", "default", "flex"]

"""Scaling the workers: KEDA's Kafka trigger sized from the workers' own settings, and a
grace period that holds their drain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    find,
    load_pod_settings,
    pod_spec,
    render,
    render_fails,
)

KEDA = ("jobs.worker.keda.enabled=true",)
WORKER = "rel-tiergate-worker"


def scaled_object(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "ScaledObject", WORKER)["spec"]
    return spec


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_no_scaled_object_unless_asked() -> None:
    docs = render()
    assert not [d for d in docs if d["apiVersion"].startswith("keda.sh/")]
    assert find(docs, "Deployment", WORKER)["spec"]["replicas"] == 2


def test_kafka_trigger_names_what_the_workers_consume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(sets=KEDA)
    spec = scaled_object(docs)
    assert spec["scaleTargetRef"] == {"name": WORKER}
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (30, 300)
    # One consumer per worker: a 9th worker would get none of the 8 partitions.
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    [trigger] = spec["triggers"]
    assert trigger["type"] == "kafka"
    kafka = load_pod_settings(docs, "Deployment", WORKER, tmp_path, monkeypatch).jobs.kafka
    assert kafka.partitions == 8
    assert trigger["metadata"] == {
        "bootstrapServers": kafka.bootstrap_servers,
        "consumerGroup": kafka.group,
        "topic": kafka.topic,
        "lagThreshold": "2",
        "offsetResetPolicy": "earliest",
        "allowIdleConsumers": "false",
        # SASL over TLS, the chart's default transport.
        "sasl": "scram_sha512",
        "tls": "enable",
    }
    # The workers' Kafka user (the shared Secret here), as KEDA authenticates.
    assert trigger["authenticationRef"] == {"name": "rel-tiergate-kafka"}
    auth = find(docs, "TriggerAuthentication", "rel-tiergate-kafka")["spec"]["secretTargetRef"]
    assert {r["name"] for r in auth} == {"kafka-credentials"}
    # KEDA owns the replica count.
    assert "replicas" not in find(docs, "Deployment", WORKER)["spec"]


@pytest.mark.parametrize(
    ("values", "concurrency", "partitions"),
    [
        (
            {"jobs": {"worker": {"concurrency": 4, "resources": {"limits": {"memory": "17Gi"}}}}},
            4,
            8,
        ),
        (
            {
                "jobs": {
                    "kafka": {"partitions": 20},
                    "worker": {
                        "config": {"jobs": {"worker": {"concurrency": 3}}},
                        "resources": {"limits": {"memory": "13Gi"}},
                    },
                }
            },
            3,
            20,
        ),
        ({"jobs": {"worker": {"concurrency": 1}, "kafka": {"partitions": 3}}}, 1, 3),
    ],
    ids=["values", "worker-config", "one-slot"],
)
def test_lag_threshold_follows_the_concurrency_and_maximum_the_partitions(
    values: dict[str, Any],
    concurrency: int,
    partitions: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(values_file(tmp_path, values), sets=KEDA)
    worker = load_pod_settings(docs, "Deployment", WORKER, tmp_path, monkeypatch).jobs
    assert (worker.worker.concurrency, worker.kafka.partitions) == (concurrency, partitions)
    spec = scaled_object(docs)
    assert spec["triggers"][0]["metadata"]["lagThreshold"] == str(concurrency)
    assert spec["maxReplicaCount"] == partitions


def test_lag_threshold_and_maximum_as_set() -> None:
    spec = scaled_object(
        render(sets=(*KEDA, "jobs.worker.keda.lagThreshold=7", "jobs.worker.keda.maxReplicas=10"))
    )
    assert spec["triggers"][0]["metadata"]["lagThreshold"] == "7"
    assert spec["maxReplicaCount"] == 10
    complaint = render_fails(*KEDA, "jobs.worker.keda.minReplicas=9")
    assert "minReplicas (9) is above maxReplicaCount (8" in complaint


def test_trigger_authentication_only_with_something_to_send() -> None:
    tls = render(sets=(*KEDA, "jobs.kafka.security.protocol=SSL"))
    [trigger] = scaled_object(tls)["triggers"]
    assert (trigger["metadata"]["sasl"], trigger["metadata"]["tls"]) == ("none", "enable")
    assert "authenticationRef" not in trigger
    assert not [d for d in tls if d["kind"] == "TriggerAuthentication"]
    ca = render(
        sets=(
            *KEDA,
            "jobs.kafka.security.protocol=SSL",
            "jobs.kafka.security.existingSecret=kafka-credentials",
            "jobs.kafka.security.caKey=ca.crt",
        )
    )
    ref = scaled_object(ca)["triggers"][0]["authenticationRef"]["name"]
    assert find(ca, "TriggerAuthentication", ref)["spec"]["secretTargetRef"] == [
        {"parameter": "ca", "name": "kafka-credentials", "key": "ca.crt"}
    ]


@pytest.mark.parametrize(
    ("values", "drain", "grace"),
    [
        ({}, 600, 630),
        ({"jobs": {"worker": {"drainSeconds": 60}}}, 60, 90),
        (
            {"jobs": {"worker": {"config": {"jobs": {"worker": {"drain_seconds": 90.5}}}}}},
            90.5,
            121,
        ),
        ({"jobs": {"worker": {"terminationGracePeriodSeconds": 600}}}, 600, 600),
        ({"jobs": {"worker": {"terminationGracePeriodSeconds": 900}}}, 600, 900),
    ],
    ids=["default", "drainSeconds", "worker-config", "set-equal", "set-longer"],
)
def test_grace_period_holds_the_drain_the_worker_reads(
    values: dict[str, Any],
    drain: float,
    grace: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(values_file(tmp_path, values))
    settings = load_pod_settings(docs, "Deployment", WORKER, tmp_path, monkeypatch)
    assert settings.jobs.worker.drain_seconds == drain
    assert pod_spec(docs, "Deployment", WORKER)["terminationGracePeriodSeconds"] == grace


def test_grace_period_shorter_than_the_drain_is_refused(tmp_path: Path) -> None:
    complaint = render_fails("jobs.worker.terminationGracePeriodSeconds=300")
    assert "terminationGracePeriodSeconds (300) is shorter than the workers' drain" in complaint
    short = values_file(
        tmp_path,
        {
            "jobs": {
                "worker": {
                    "terminationGracePeriodSeconds": 100,
                    "config": {"jobs": {"worker": {"drain_seconds": 120}}},
                }
            }
        },
    )
    assert "drain_seconds = 120" in render_fails(values=(short,))
    # The environment would win over the file the grace period and the trigger are sized from.
    for name in ("TIERGATE_JOBS__WORKER__DRAIN_SECONDS", "tiergate_jobs__kafka__partitions"):
        complaint = render_fails(
            f"jobs.worker.extraEnv[0].name={name}", "jobs.worker.extraEnv[0].value=5"
        )
        assert f"jobs.worker.extraEnv: {name} would override" in complaint


@pytest.mark.parametrize(
    "sets",
    [(), KEDA, (*KEDA, "gateway.autoscaling.enabled=true")],
    ids=["defaults", "keda", "keda-and-gateway-hpa"],
)
def test_only_keda_scales_the_workers(sets: tuple[str, ...]) -> None:
    # The chart has no HorizontalPodAutoscaler of its own for the workers (KEDA makes one from
    # the ScaledObject), so there is no second autoscaler to be exclusive with.
    docs = render(sets=sets)
    targets = [
        d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"
    ]
    assert WORKER not in targets
    scaled = [d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "ScaledObject"]
    assert scaled.count(WORKER) == (1 if sets else 0)

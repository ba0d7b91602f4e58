"""What the chart exposes: engines behind the gateway only, one engine key, /metrics off
the Ingress, shutdown within the grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    VALUES,
    container_env,
    find,
    load_pod_settings,
    pod_spec,
    render,
    render_fails,
)


def _labels(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    labels: dict[str, str] = find(docs, "Deployment", name)["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_vllm_network_policy_admits_only_gateway_and_workers(values: Path) -> None:
    docs = render(values)
    policy = find(docs, "NetworkPolicy", "rel-tiergate-vllm")["spec"]
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    for name in deployments:
        engine = name.startswith("rel-tiergate-vllm-")
        assert _selects(policy["podSelector"], _labels(docs, name)) == engine, name
    assert policy["policyTypes"] == ["Ingress"]
    jobs = "rel-tiergate-worker" in deployments
    monitored = any(d["kind"] == "ServiceMonitor" for d in docs)
    peers = [peer for rule in policy["ingress"] for peer in rule["from"]]
    for rule in policy["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    admitted = set()
    for peer in peers:
        if "namespaceSelector" in peer:  # Prometheus, only when the chart's monitoring is on
            assert monitored
            assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
            continue
        for name in deployments:
            if _selects(peer["podSelector"], _labels(docs, name)):
                admitted.add(name)
    expected = {"rel-tiergate-gateway"} | ({"rel-tiergate-worker"} if jobs else set())
    assert admitted == expected
    assert len(peers) == len(expected) + (1 if monitored else 0)


def test_engines_and_gateway_share_one_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for values in VALUES:
        docs = render(values)
        keys = set()
        for tier in ("standard", "fast"):
            vllm = pod_spec(docs, "Deployment", f"rel-tiergate-vllm-{tier}")["containers"][0]
            env = container_env(docs, vllm)
            keys.add(env["VLLM_API_KEY"])
            assert not any("api-key" in a for a in vllm["args"]), "the key stays off argv"
        gateway = load_pod_settings(
            docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch
        )
        keys |= {gateway.tiers[t].api_key for t in gateway.tiers}  # type: ignore[misc]
        assert len(keys) == 1 and None not in keys, values.name
        assert len(next(iter(keys))) >= 32


# --- Nothing private on the public path ----------------------------------------------------


def test_metrics_are_not_routed_by_the_ingress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    settings = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert settings.gateway.metrics_port is not None
    assert settings.gateway.metrics_port != settings.gateway.port
    assert settings.gateway.docs is False
    container = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.gateway.port, "metrics": settings.gateway.metrics_port}
    service = {p["name"]: p for p in find(docs, "Service", "rel-tiergate-gateway")["spec"]["ports"]}
    assert service["http"]["targetPort"] == "http"
    assert service["metrics"]["targetPort"] == "metrics"
    backends = [
        path["backend"]["service"]
        for rule in find(docs, "Ingress", "rel-tiergate-gateway")["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    assert backends == [{"name": "rel-tiergate-gateway", "port": {"name": "http"}}]
    monitor = find(docs, "ServiceMonitor", "rel-tiergate-gateway")["spec"]
    assert monitor["endpoints"][0]["port"] == "metrics"
    assert _selects(monitor["selector"], _labels(docs, "rel-tiergate-gateway"))
    engines = find(docs, "ServiceMonitor", "rel-tiergate-vllm")["spec"]
    assert not _selects(engines["selector"], _labels(docs, "rel-tiergate-gateway"))


# --- Readiness and graceful shutdown -------------------------------------------------------


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_shutdown_fits_the_grace_period(
    values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(values)
    pod = pod_spec(docs, "Deployment", "rel-tiergate-gateway")
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    settings = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    grace = settings.gateway.shutdown_grace_seconds
    assert pre_stop > 0 and grace >= 60
    assert pre_stop + grace < pod["terminationGracePeriodSeconds"]
    for tier in ("standard", "fast"):
        engine = pod_spec(docs, "Deployment", f"rel-tiergate-vllm-{tier}")
        sleep = engine["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert sleep > settings.tiers[tier].dns.refresh_seconds  # type: ignore[index, union-attr]
        assert sleep < engine["terminationGracePeriodSeconds"]
    complaint = render_fails("gateway.config.gateway.shutdown_grace_seconds=200")
    assert "terminationGracePeriodSeconds" in complaint


# --- Tier fitting in the cluster -----------------------------------------------------------


def test_engines_admit_scrapers_of_the_monitoring_namespace_only(tmp_path: Path) -> None:
    """Attacker's test: the engines' scraper rule admitted any pod labelled
    app.kubernetes.io/name=prometheus in any namespace to the engines' API port, where
    vLLM's key guards /v1 only: a tenant's pod so labelled called /invocations (the model)
    without keys, limits or tiers. Peers now name their namespace, and values that would
    admit every namespace are refused."""
    docs = render(sets=("metrics.serviceMonitor.enabled=true",))
    policy = find(docs, "NetworkPolicy", "rel-tiergate-vllm")["spec"]
    scrapers = [
        peer for rule in policy["ingress"] for peer in rule["from"] if "namespaceSelector" in peer
    ]
    assert scrapers, "monitoring on: Prometheus is admitted"
    tenant_namespace = {"kubernetes.io/metadata.name": "team-a"}
    for peer in scrapers:
        assert not _selects(peer["namespaceSelector"], tenant_namespace), peer
        assert _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "monitoring"})
    prometheus = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    for i, peer in enumerate(({"namespaceSelector": {}, **prometheus}, prometheus)):
        values = tmp_path / f"scrapers-{i}.yaml"
        values.write_text(yaml.safe_dump({"vllm": {"networkPolicy": {"scrapers": [peer]}}}))
        err = render_fails("metrics.serviceMonitor.enabled=true", values=(values,))
        assert "vllm.networkPolicy.scrapers" in err and "namespace" in err


def test_replicas_share_the_cache_salt_key() -> None:
    """Every gateway replica gets the same routing.cache_salt_secret (the engines' key), so
    a tenant's prefix-cache hits hold whichever replica serves it."""
    docs = render()
    gateway = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    env = {e["name"]: e for e in gateway["env"]}
    ref = env["TIERGATE_ROUTING__CACHE_SALT_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == env["TIERGATE_TIERS__STANDARD__API_KEY"]["valueFrom"]["secretKeyRef"]


def test_the_gateways_tmp_holds_every_spooled_transfer_the_settings_allow() -> None:
    """/tmp was 1 GiB while the settings let 8 transfers spool up to twice a 200 MB file
    each (an upload's part and copy): three batch creates of a large file would fill it,
    and the kubelet evicts a pod past its emptyDir's sizeLimit."""
    for sets, slots, biggest in (
        ((), 8, 200_000_000),
        (
            (
                "gateway.config.jobs.max_concurrent_uploads=3",
                "gateway.config.jobs.files.max_file_bytes=500000000",
            ),
            3,
            500_000_000,
        ),
    ):
        spec = pod_spec(render(sets=sets), "Deployment", "rel-tiergate-gateway")
        tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
        assert int(tmp["emptyDir"]["sizeLimit"]) >= slots * 2 * biggest, tmp

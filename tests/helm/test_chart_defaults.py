"""The chart's hardened defaults: auth off only by a loud choice and behind the gateway's
NetworkPolicy (which is on by default), secrets the same on every render (GitOps), workers'
egress to named destinations only, and the workers' key as a file they read again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm import chart

GATEWAY, WORKER = "rel-tiergate-gateway", "rel-tiergate-worker"
API_PORT, METRICS_PORT = 8000, 9090
MONITORING = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
INGRESS_NGINX = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}},
}
STRIMZI = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}},
    "podSelector": {"matchLabels": {"strimzi.io/kind": "Kafka"}},
}
MINIO = "jobs.storage.peers[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=minio"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def _pod_labels(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    doc = chart.find(docs, kind, name)
    meta = doc["metadata"] if kind == "Pod" else doc["spec"]["template"]["metadata"]
    labels: dict[str, str] = meta["labels"]
    return labels


def _rules_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    peers: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["ingress"]:
        # A rule without peers (or ports) would admit every pod (or port).
        assert rule.get("from") and rule.get("ports"), rule
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            peers.setdefault(port["port"], []).extend(rule["from"])
    return peers


# --- Auth off only by a loud choice, behind a NetworkPolicy ----------------------------------


def test_auth_off_needs_the_loud_setting_and_the_network_policy() -> None:
    said = chart.render_fails("auth.enabled=false")
    assert "auth.insecureDisabled=true" in said, said
    said = chart.render_fails(
        "auth.enabled=false", "auth.insecureDisabled=true", "gateway.networkPolicy.enabled=false"
    )
    assert "gateway.networkPolicy.enabled" in said, said
    docs = chart.render(sets=("auth.enabled=false", "auth.insecureDisabled=true"))
    config = yaml.safe_load(chart.find(docs, "ConfigMap", GATEWAY)["data"]["tiergate.yaml"])
    assert config["auth"] == {"enabled": False}
    assert chart.find(docs, "NetworkPolicy", GATEWAY)


@pytest.mark.parametrize("values", [None, *chart.VALUES], ids=lambda p: p.stem if p else "defaults")
def test_gateway_network_policy_admits_only_what_values_allow(values: Path | None) -> None:
    docs = chart.render(*([values] if values else []))
    policy = chart.find(docs, "NetworkPolicy", GATEWAY)["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    deployments = [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"]
    for name in deployments:
        assert _selects(policy["podSelector"], _pod_labels(docs, "Deployment", name)) == (
            name == GATEWAY
        ), name
    peers = _rules_by_port(policy)
    assert set(peers) == {API_PORT, METRICS_PORT}
    jobs = WORKER in deployments
    ingress = any(d["kind"] == "Ingress" for d in docs)
    local = [p for p in peers[API_PORT] if set(p) == {"podSelector"}]
    others = [p for p in peers[API_PORT] if set(p) != {"podSelector"}]
    # The workers and the chart's helm test pod, of this release, from its namespace ...
    components = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in local}
    assert components == {"test"} | ({"worker"} if jobs else set())
    for peer in local:
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rel"
    if jobs:
        assert any(
            _selects(p["podSelector"], _pod_labels(docs, "Deployment", WORKER)) for p in local
        )
    test_pod = _pod_labels(docs, "Pod", "rel-tiergate-test-tiers")
    assert any(_selects(p["podSelector"], test_pod) for p in local)
    # ... the Ingress controller's pods only with an Ingress, and nothing else.
    assert others == ([INGRESS_NGINX] if ingress else [])
    # The metrics port: Prometheus in the monitoring namespace, nothing else.
    assert peers[METRICS_PORT] == [MONITORING]


def test_gateway_network_policy_takes_the_peers_values_name() -> None:
    team = {"namespaceSelector": {"matchLabels": {"team": "apps"}}}
    docs = chart.render(
        sets=(
            "gateway.networkPolicy.from[0].namespaceSelector.matchLabels.team=apps",
            "gateway.networkPolicy.scrapers=null",
        )
    )
    peers = _rules_by_port(chart.find(docs, "NetworkPolicy", GATEWAY)["spec"])
    assert set(peers) == {API_PORT} and team in peers[API_PORT]
    off = chart.render(sets=("gateway.networkPolicy.enabled=false",))
    assert not any(d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == GATEWAY for d in off)
    # Configurations the policy would silently cut off are refused.
    said = chart.render_fails(
        "gateway.ingress.enabled=true", "gateway.networkPolicy.ingressController=null"
    )
    assert "gateway.networkPolicy.ingressController" in said, said
    said = chart.render_fails("gateway.service.type=LoadBalancer")
    assert "gateway.networkPolicy.from" in said and "ipBlock" in said, said
    docs = chart.render(
        sets=(
            "gateway.service.type=LoadBalancer",
            "gateway.networkPolicy.from[0].ipBlock.cidr=203.0.113.0/24",
        )
    )
    peers = _rules_by_port(chart.find(docs, "NetworkPolicy", GATEWAY)["spec"])
    assert {"ipBlock": {"cidr": "203.0.113.0/24"}} in peers[API_PORT]


# --- Secrets the same on every render ------------------------------------------------------


def _generated(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {
        "worker-api-key": chart.secret_values(docs, "rel-tiergate-auth")["worker-api-key"],
        "engine-api-key": chart.secret_values(docs, "rel-tiergate-engine")["engine-api-key"],
        "redis-password": chart.secret_values(docs, "rel-tiergate-redis")["redis-password"],
    }


def _secrets_checksums(docs: list[dict[str, Any]]) -> dict[str, str | None]:
    return {
        name: chart.find(docs, "Deployment", name)["spec"]["template"]["metadata"]
        .get("annotations", {})
        .get("checksum/secrets")
        for name in (GATEWAY, "rel-tiergate-vllm-standard", "rel-tiergate-redis", WORKER)
    }


def test_generated_secrets_are_the_same_on_every_render() -> None:
    # helm template has no cluster to look a Secret up in (Argo CD, Flux): twice the same.
    first = chart.render_text()
    assert chart.render_text() == first
    docs = [d for d in yaml.safe_load_all(first) if d]
    made = _generated(docs)
    assert len(set(made.values())) == 3
    assert all(len(v) >= 32 for v in made.values()), made
    assert made["worker-api-key"].startswith("tg-")
    # Another seed, other secrets; and the pods that read them at start roll with them.
    other = chart.render(sets=("secretSeed=another-seed-0123456789abcdef0123456789ab",))
    assert not set(_generated(other).values()) & set(made.values())
    before, after = _secrets_checksums(docs), _secrets_checksums(other)
    for name in (GATEWAY, "rel-tiergate-vllm-standard", "rel-tiergate-redis"):
        assert before[name] and after[name] and before[name] != after[name], name
    # The workers read their key again from its file: no restart for it.
    assert before[WORKER] is None and after[WORKER] is None
    # The secrets stay in their Secrets: none in a ConfigMap or an annotation.
    elsewhere = json.dumps(
        [d.get("data") for d in docs if d["kind"] == "ConfigMap"]
        + [d["spec"]["template"]["metadata"] for d in docs if d["kind"] == "Deployment"]
    )
    assert not [name for name, value in made.items() if value in elsewhere]


def test_without_a_seed_or_existing_secrets_rendering_fails() -> None:
    said = chart.render_fails("jobs.storage.cidrs[0]=10.0.64.0/24", required=False)
    assert "secretSeed" in said and "helm template" in said, said
    said = chart.render_fails("secretSeed=short", "jobs.storage.cidrs[0]=10.0.64.0/24")
    assert "at least 32" in said, said


def test_every_secret_can_come_from_an_existing_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    production = chart.CHART / "ci" / "gpu-production.yaml"
    assert "secretSeed" not in yaml.safe_load(production.read_text())
    docs = chart.render(production)
    assert not [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
    gateway = chart.load_pod_settings(docs, "Deployment", GATEWAY, tmp_path, monkeypatch)
    password = chart.EXISTING_SECRETS["tiergate-redis"]["redis-password"]
    assert gateway.limits.redis_url == f"redis://:{password}@rel-tiergate-redis:6379/0"
    engine_key = chart.EXISTING_SECRETS["tiergate-engine"]["engine-api-key"]
    assert {gateway.tiers[t].api_key for t in gateway.tiers} == {engine_key}
    redis = chart.pod_spec(docs, "Deployment", "rel-tiergate-redis")["containers"][0]
    assert chart.container_env(docs, redis)["REDIS_PASSWORD"] == password
    # redis.existingSecret with a key of its own, beside a seed for the rest.
    docs = chart.render(sets=("redis.existingSecret=my-redis", "redis.existingSecretKey=pw"))
    assert not any(
        d["metadata"]["name"] == "rel-tiergate-redis" for d in docs if d["kind"] == "Secret"
    )
    redis = chart.pod_spec(docs, "Deployment", "rel-tiergate-redis")["containers"][0]
    ref = next(e for e in redis["env"] if e["name"] == "REDIS_PASSWORD")["valueFrom"]
    assert ref["secretKeyRef"] == {"name": "my-redis", "key": "pw"}


# --- Workers' egress to named destinations only --------------------------------------------


def test_workers_egress_defaults_name_no_address_range() -> None:
    kafka = "jobs.kafka.security.existingSecret=kafka-credentials"
    said = chart.render_fails(f"secretSeed={chart.SEED}", kafka, required=False)
    assert "jobs.storage" in said and "API server" in said, said
    # The defaults, with the one thing they leave open named: an in-cluster store's pods.
    docs = chart.render(
        sets=(f"secretSeed={chart.SEED}", kafka, MINIO, "jobs.storage.port=9000"), required=False
    )
    egress = chart.find(docs, "NetworkPolicy", WORKER)["spec"]["egress"]
    assert not [p for rule in egress for p in rule["to"] if "ipBlock" in p], egress
    gateway = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "tiergate",
                "app.kubernetes.io/instance": "rel",
                "app.kubernetes.io/component": "gateway",
            }
        }
    }
    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    minio = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "minio"}}}
    assert egress == [
        {"to": [gateway], "ports": [{"protocol": "TCP", "port": API_PORT}]},
        {"to": [STRIMZI], "ports": [{"protocol": "TCP", "port": 9092}]},
        {"to": [minio], "ports": [{"protocol": "TCP", "port": 9000}]},
        {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    ]


# --- The workers' key as a file ------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [None, chart.CHART / "ci" / "gpu-production.yaml"],
    ids=["chart-secret", "existing-secret"],
)
def test_workers_read_their_key_from_a_mounted_file(values: Path | None) -> None:
    docs = chart.render(*([values] if values else []))
    spec = chart.pod_spec(docs, "Deployment", WORKER)
    worker = spec["containers"][0]
    env = {e["name"]: e for e in worker["env"]}
    assert "TIERGATE_JOBS__WORKER__API_KEY" not in env
    path = Path(env["TIERGATE_JOBS__WORKER__API_KEY_FILE"]["value"])
    mount = next(m for m in worker["volumeMounts"] if m["mountPath"] == str(path.parent))
    # No subPath: a subPath mount never sees the Secret's update.
    assert "subPath" not in mount and mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    secret = "tiergate-auth" if values else "rel-tiergate-auth"
    assert volume["secret"] == {
        "secretName": secret,
        "items": [{"key": "worker-api-key", "path": path.name}],
    }

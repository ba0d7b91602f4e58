"""The Helm chart: lint, render and validate every values file against Kubernetes' schemas;
the tiers, the workers and the containers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.helm.chart import (
    CHART,
    CRDS,
    K8S_VERSION,
    REQUIRED,
    VALUES,
    _use_gateway_config,
    containers,
    find,
    helm,
    load_pod_settings,
    render,
    render_fails,
)
from tiergate.settings import load_settings
from tiergate.speculative.config import SpeculativeConfig


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda p: p.stem if p else "defaults")
def test_lint_render_and_validate(values: Path | None) -> None:
    files = [values] if values else []
    # The defaults alone leave a seed and the object store's addresses to the installer.
    sets = [] if values else [a for s in REQUIRED for a in ("--set", s)]
    subprocess.run(
        [helm(), "lint", str(CHART), *(a for f in files for a in ("-f", str(f))), *sets],
        check=True,
        capture_output=True,
    )
    docs = render(*files)
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            assert doc["metadata"]["name"].startswith("rel-tiergate")
            assert doc["spec"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_fast_tier_runs_the_quantized_checkpoint_with_speculation() -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    args = find(docs, "Deployment", "rel-tiergate-vllm-fast")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--model=/models/Llama-3.1-8B-Instruct-W4A16" in args
    spec = json.loads(
        next(a for a in args if a.startswith("--speculative-config=")).split("=", 1)[1]
    )
    assert spec == {
        "method": "eagle3",
        "model": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    # The rendered configuration is one tiergate itself accepts.
    from pydantic import TypeAdapter

    TypeAdapter(SpeculativeConfig).validate_python(spec)
    standard = find(docs, "Deployment", "rel-tiergate-vllm-standard")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert not any(a.startswith("--speculative-config") for a in standard["args"])
    assert standard["resources"]["limits"]["nvidia.com/gpu"] == 1
    cpu = render(CHART / "ci" / "cpu-small.yaml")
    cpu_fast = find(cpu, "Deployment", "rel-tiergate-vllm-fast")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert (
        '--speculative-config={"method":"ngram","num_speculative_tokens":3,'
        '"prompt_lookup_max":4,"prompt_lookup_min":2}' in cpu_fast["args"]
    )
    assert "nvidia.com/gpu" not in cpu_fast["resources"]["limits"]


def test_gateway_configuration_lists_both_tiers_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    _use_gateway_config(docs, tmp_path, monkeypatch)
    settings = load_settings()
    for tier in ("standard", "fast"):
        dns = settings.tiers[tier].dns  # type: ignore[index]
        assert dns is not None
        service = find(docs, "Service", f"rel-tiergate-vllm-{tier}")
        assert service["spec"]["clusterIP"] == "None"
        assert dns.name == f"rel-tiergate-vllm-{tier}.llm.svc.cluster.local"
        assert dns.port == service["spec"]["ports"][0]["port"]
    deployment = find(docs, "Deployment", "rel-tiergate-gateway")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("vllm.tiers.fast.speculative.method=medusa", "speculative/method"),
        ("vllm.tiers.fast.speculative.model=", "speculative"),
        ("gateway.port=0", "gateway/port"),
        ("jobs.kafka.cidrs[0]=kafka.local", "cidrs"),
        ("gateway.config.policy.auto_tier=turbo", "auto_tier"),
        ("gateway.replicaz=3", "replicaz"),
        ("gateway.networkPolicy.enabeld=true", "enabeld"),
        ("auth.insecureDisabled=maybe", "insecureDisabled"),
        ("redis.existingSecret=Not_A_Name", "existingSecret"),
    ],
)
def test_schema_refuses_wrong_values(setting: str, complaint: str) -> None:
    proc = subprocess.run(
        [helm(), "template", "rel", str(CHART), "--set", setting],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "schema" in proc.stderr and complaint in proc.stderr, proc.stderr


def test_worker_network_policy_allows_nothing_else() -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    policy = find(docs, "NetworkPolicy", "rel-tiergate-worker")["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    # Only Prometheus may come in, and only to the metrics port.
    assert policy["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 9400}],
        }
    ]
    unscraped = render(CHART / "ci" / "cpu-small.yaml")
    assert find(unscraped, "NetworkPolicy", "rel-tiergate-worker")["spec"]["ingress"] == []
    peers = []
    for rule in policy["egress"]:
        ports = sorted((p["protocol"], p["port"]) for p in rule["ports"])
        for peer in rule["to"]:
            if "ipBlock" in peer:
                peers.append(("cidr", peer["ipBlock"]["cidr"], tuple(ports)))
            else:
                labels = peer["podSelector"]["matchLabels"]
                who = labels.get("app.kubernetes.io/component") or labels.get("k8s-app")
                peers.append(("pods", who, tuple(ports)))
    assert sorted(peers) == sorted(
        [
            ("pods", "gateway", (("TCP", 8000),)),
            ("cidr", "10.20.0.0/16", (("TCP", 9092),)),
            ("cidr", "10.20.64.0/24", (("TCP", 443),)),
            ("pods", "kube-dns", (("TCP", 53), ("UDP", 53))),
        ]
    )
    worker = find(docs, "Deployment", "rel-tiergate-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 600
    assert worker["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_workers_are_probed_and_scraped_on_their_metrics_port() -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    worker = find(docs, "Deployment", "rel-tiergate-worker")["spec"]["template"]
    container = worker["spec"]["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TIERGATE_JOBS__WORKER__METRICS_PORT"] == "9400"
    monitor = find(docs, "PodMonitor", "rel-tiergate-worker")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    assert monitor["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    # Without the Prometheus Operator objects there is nothing to scrape with.
    kinds = {d["kind"] for d in render(CHART / "ci" / "cpu-small.yaml")}
    assert "PodMonitor" not in kinds


def test_jobs_disabled_deploys_no_worker() -> None:
    docs = render(CHART / "ci" / "jobs-disabled.yaml")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "rel-tiergate-worker") not in kinds
    # No worker, no worker NetworkPolicy, and no worker among the engines' peers.
    assert ("NetworkPolicy", "rel-tiergate-worker") not in kinds
    assert ("ConfigMap", "rel-tiergate-worker") not in kinds
    assert ("Deployment", "rel-tiergate-gateway") in kinds


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_container_is_bounded_and_hardened(values: Path) -> None:
    for where, container in containers(render(values)):
        resources = container.get("resources", {})
        assert resources.get("requests") and resources.get("limits"), where
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["capabilities"] == {"drop": ["ALL"]}, where
        assert security["readOnlyRootFilesystem"] is True, where


def test_worker_and_gateway_settings_are_ones_tiergate_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    _use_gateway_config(docs, tmp_path, monkeypatch)
    gateway = load_settings()
    assert gateway.jobs.enabled and gateway.jobs.kafka.bootstrap_servers.startswith("kafka-0")
    monkeypatch.delenv("TIERGATE_CONFIG")
    settings = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    assert settings.jobs.enabled
    assert settings.jobs.storage.bucket == "acme-agent-jobs"
    assert settings.jobs.worker.concurrency == 2
    assert settings.jobs.worker.metrics_port == 9400
    assert settings.jobs.gateway_url == "http://rel-tiergate-gateway:80"
    assert settings.jobs.kafka.topic == gateway.jobs.kafka.topic


# --- Keys on by default --------------------------------------------------------------------


def test_both_tiers_start_with_the_same_tool_calling() -> None:
    def args(docs: list[dict[str, Any]], tier: str) -> list[str]:
        spec = find(docs, "Deployment", f"rel-tiergate-vllm-{tier}")["spec"]["template"]["spec"]
        return list(spec["containers"][0]["args"])

    docs = render()
    for tier in ("standard", "fast"):
        assert "--enable-auto-tool-choice" in args(docs, tier)
        assert "--tool-call-parser=llama3_json" in args(docs, tier)
        assert not any(a.startswith("--chat-template") for a in args(docs, tier))
    templated = render(
        sets=("vllm.toolCalling.parser=hermes", "vllm.toolCalling.chatTemplate=/t/tools.jinja")
    )
    for tier in ("standard", "fast"):
        assert {"--tool-call-parser=hermes", "--chat-template=/t/tools.jinja"} <= set(
            args(templated, tier)
        )
    off = render(sets=("vllm.toolCalling.parser=",))
    assert not any("tool" in a for a in args(off, "standard") + args(off, "fast"))


def test_engines_schedule_by_the_priority_the_gateway_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render()
    for tier in ("standard", "fast"):
        spec = find(docs, "Deployment", f"rel-tiergate-vllm-{tier}")["spec"]["template"]["spec"]
        assert "--scheduling-policy=priority" in spec["containers"][0]["args"]
    _use_gateway_config(docs, tmp_path, monkeypatch)
    assert load_settings().policy.engine_priorities is True
    said = render_fails("vllm.priorityScheduling=false")
    assert "engine_priorities" in said


def test_small_model_gets_the_chart_chat_template_for_tools() -> None:
    docs = render(CHART / "ci" / "cpu-small.yaml")
    shipped = find(docs, "ConfigMap", "rel-tiergate-chat-templates")["data"]
    # The chart's copy is the package's template (what the local stack's engines use).
    package = Path(__file__).resolve().parents[2] / "tiergate" / "engine" / "templates"
    assert shipped["chatml_tools.jinja"] == (package / "chatml_tools.jinja").read_text()
    for tier in ("standard", "fast"):
        spec = find(docs, "Deployment", f"rel-tiergate-vllm-{tier}")["spec"]["template"]["spec"]
        container = spec["containers"][0]
        assert "--tool-call-parser=hermes" in container["args"]
        assert (
            "--chat-template=/etc/tiergate-chat-templates/chatml_tools.jinja" in container["args"]
        )
        mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mount["chat-templates"] == "/etc/tiergate-chat-templates"

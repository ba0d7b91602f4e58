"""The Helm chart: lint, render, validate against Kubernetes' schemas, and check what matters.

The helm binary comes from scripts/install-helm.sh (run by the bootstrap); its absence is
a failure, not a skip.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tiergate import chartschema
from tiergate.evidence import TierDecision
from tiergate.gateway.auth import hash_key
from tiergate.settings import Recipe, Settings, load_settings
from tiergate.speculative.config import SpeculativeConfig
from tiergate.tuning.fingerprint import digest, hardware_fingerprint
from tiergate.tuning.tuner import inputs_digest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tiergate"
VALUES = sorted((CHART / "ci").glob("*.yaml"))
K8S_VERSION = kubernetes_validate.latest_version()
# Custom resources whose schemas kubernetes-validate does not carry; checked by hand below.
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
}
# What the existing Secrets that ci/gpu-production.yaml names hold (auth, Kafka).
WORKER_KEY = "tg-worker-key-for-the-tests"
EXISTING_SECRETS = {
    "tiergate-auth": {
        "auth-keys": json.dumps(
            [
                {"name": "team-a", "hash": hash_key("tg-team-a")},
                {"name": "job-workers", "hash": hash_key(WORKER_KEY), "acts_for_job_owners": True},
            ]
        ),
        "worker-api-key": WORKER_KEY,
    },
    "kafka-credentials": {"username": "tiergate", "password": "s3cret", "ca.crt": "PEM"},
}


def helm() -> str:
    found = shutil.which("helm", path=str(ROOT / ".venv" / "bin")) or shutil.which("helm")
    assert found, "helm is missing: run scripts/install-helm.sh (the bootstrap does)"
    return found


def render(*values: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = [helm(), "template", "rel", str(CHART), "--namespace", "llm"]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name}")


def secret_values(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    """A Secret's entries: one the chart made, or one of EXISTING_SECRETS."""
    for doc in docs:
        if doc["kind"] == "Secret" and doc["metadata"]["name"] == name:
            found = dict(doc.get("stringData", {}))
            for key, value in doc.get("data", {}).items():
                found[key] = base64.b64decode(value).decode()
            return found
    if name in EXISTING_SECRETS:
        return EXISTING_SECRETS[name]
    raise AssertionError(f"no Secret {name}")


def pod_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def container_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: Secrets resolved, $(VAR) expanded."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"]
            )
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_values(docs, ref["name"])[ref["key"]]
    return env


def load_pod_settings(
    docs: list[dict[str, Any]],
    kind: str,
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    container: int = 0,
) -> Settings:
    """The settings a pod's container loads: its environment, and TIERGATE_CONFIG pointing at
    the ConfigMap mounted where the environment says."""
    spec = pod_spec(docs, kind, name)
    box = spec["containers"][container]
    env = container_env(docs, box)
    path = Path(env["TIERGATE_CONFIG"])
    mount = next(m for m in box["volumeMounts"] if m["mountPath"] == str(path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    data = find(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    config = tmp_path / f"{name}-{path.name}"
    config.write_text(data[path.name])
    env["TIERGATE_CONFIG"] = str(config)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        return load_settings()
    finally:
        for key in env:
            monkeypatch.delenv(key)


def _use_gateway_config(
    docs: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point TIERGATE_CONFIG at the gateway configuration the chart rendered, with the rest
    of the gateway's environment (its keys come from Secrets)."""
    gateway = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    for key, value in container_env(docs, gateway).items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "tiergate.yaml"
    config.write_text(find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"])
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))


def render_fails(*sets: str, values: tuple[Path, ...] = ()) -> str:
    """helm template's complaint for values it must refuse."""
    args = [helm(), "template", "rel", str(CHART)]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode != 0, "rendered values that must be refused"
    return proc.stderr


def containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every container (init containers included) of every Deployment, Job and Pod."""
    found = []
    for doc in docs:
        spec = doc.get("spec", {})
        pod = (
            spec.get("template", {}).get("spec")
            if doc["kind"] in ("Deployment", "Job")
            else (spec if doc["kind"] == "Pod" else None)
        )
        for container in (pod or {}).get("initContainers", []) + (pod or {}).get("containers", []):
            found.append((f"{doc['kind']}/{doc['metadata']['name']}", container))
    return found


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda p: p.stem if p else "defaults")
def test_lint_render_and_validate(values: Path | None) -> None:
    files = [values] if values else []
    subprocess.run(
        [helm(), "lint", str(CHART), *(a for f in files for a in ("-f", str(f)))],
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
            ("cidr", "0.0.0.0/0", (("TCP", 443),)),
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


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda p: p.stem if p else "defaults")
def test_every_values_file_turns_keys_on(values: Path | None) -> None:
    docs = render(*([values] if values else []))
    config = yaml.safe_load(
        find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert config["auth"] == {"enabled": True}
    gateway = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    keys = next(e for e in gateway["env"] if e["name"] == "TIERGATE_AUTH__KEYS")
    assert keys["valueFrom"]["secretKeyRef"]["key"] == "auth-keys"


def test_default_values_take_key_hashes_from_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render()
    secret = find(docs, "Secret", "rel-tiergate-auth")
    entries = json.loads(secret["stringData"]["auth-keys"])
    worker_key = secret["stringData"]["worker-api-key"]
    # Hashes only: no entry carries a key, and the workers' key is stored as its hash.
    assert all(set(e) <= {"name", "hash", "acts_for_job_owners"} for e in entries)
    assert worker_key not in secret["stringData"]["auth-keys"]
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert gateway.auth.enabled
    by_hash = {k.hash: k for k in gateway.auth.keys}
    worker = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    assert worker.jobs.worker.api_key == worker_key
    entry = by_hash[hash_key(worker_key)]
    assert entry.name == "job-workers" and entry.acts_for_job_owners
    # Client keys from values join it, as hashes.
    team = hash_key("tg-team-a")
    docs = render(sets=("auth.keys[0].name=team-a", f"auth.keys[0].hash={team}"))
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert [k.name for k in gateway.auth.keys] == ["team-a", "job-workers"]
    assert not gateway.auth.keys[0].acts_for_job_owners


def test_existing_secret_holds_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    assert not any(d["kind"] == "Secret" and d["metadata"]["name"].endswith("-auth") for d in docs)
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    worker = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    assert {k.name for k in gateway.auth.keys} == {"team-a", "job-workers"}
    acting = {k.hash for k in gateway.auth.keys if k.acts_for_job_owners}
    assert worker.jobs.worker.api_key is not None
    assert acting == {hash_key(worker.jobs.worker.api_key)}


@pytest.mark.parametrize(
    "public", ["gateway.ingress.enabled=true", "gateway.service.type=LoadBalancer"]
)
def test_public_gateway_without_keys_fails_to_render(public: str) -> None:
    complaint = render_fails("auth.enabled=false", public)
    assert "auth.allowAnonymous" in complaint, complaint
    # An explicit choice renders, and the gateway then has no keys.
    docs = render(sets=("auth.enabled=false", public, "auth.allowAnonymous=true"))
    config = yaml.safe_load(
        find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert config["auth"] == {"enabled": False}
    gateway = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    assert "TIERGATE_AUTH__KEYS" not in {e["name"] for e in gateway["env"]}
    worker = pod_spec(docs, "Deployment", "rel-tiergate-worker")["containers"][0]
    assert "TIERGATE_JOBS__WORKER__API_KEY" not in {e["name"] for e in worker["env"]}
    # A private gateway with auth off renders too.
    render(sets=("auth.enabled=false",))


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (
            (
                "gateway.config.auth.keys[0].name=x",
                f"gateway.config.auth.keys[0].hash={'sha256:' + '0' * 64}",
            ),
            "auth.keys",
        ),
        (("gateway.config.auth.enabled=false",), "use auth.enabled"),
        (("gateway.config.tiers.fast.api_key=plain",), "vllm.apiKey"),
        (("jobs.worker.config.jobs.worker.api_key=plain",), "auth Secret"),
    ],
)
def test_keys_never_come_from_the_settings_values(sets: tuple[str, ...], complaint: str) -> None:
    stderr = render_fails(*sets)
    assert complaint in stderr, stderr


def test_keys_without_any_entry_fail_to_render() -> None:
    assert "no keys" in render_fails("jobs.enabled=false")


# --- Shared limits -------------------------------------------------------------------------


def test_limits_shared_through_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render()
    redis = pod_spec(docs, "Deployment", "rel-tiergate-redis")["containers"][0]
    assert "--requirepass" in redis["args"]
    password = secret_values(docs, "rel-tiergate-redis")["redis-password"]
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert gateway.limits.redis_url == f"redis://:{password}@rel-tiergate-redis:6379/0"
    service = find(docs, "Service", "rel-tiergate-redis")["spec"]
    assert service["ports"][0]["port"] == 6379
    policy = find(docs, "NetworkPolicy", "rel-tiergate-redis")["spec"]
    assert [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for rule in policy["ingress"]
        for p in rule["from"]
    ] == ["gateway"]
    # An external Redis instead of the chart's.
    docs = render(sets=("limits.redisUrl=redis://cache.example:6379/2",))
    assert not any(d["metadata"]["name"] == "rel-tiergate-redis" for d in docs)
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert gateway.limits.redis_url == "redis://cache.example:6379/2"
    # One replica, no Redis: in-process counting.
    docs = render(CHART / "ci" / "cpu-small.yaml")
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert gateway.limits.redis_url is None


# --- The whole settings tree ---------------------------------------------------------------

# One value per top-level section of Settings (each differs from tiergate's default).
SECTION_VALUES: dict[str, Any] = {
    "gateway": {"max_tokens_limit": 4096, "docs": True},
    "tiers": {"standard": {"long_context_endpoints": ["http://10.1.2.3:8000"]}},
    "profiles": {"standard": {"model": "/models/x", "port": 8101, "kv_cache_gib": 3}},
    "health": {"timeout_seconds": 1.5},
    "timeouts": {"connect_seconds": 3.5},
    "routing": {"prefix_chars": 256},
    "policy": {"auto_tier": "headroom"},
    "auth": {},
    "limits": {"chars_per_token": 3.0},
    "admission": {"tiers": {"fast": {"max_concurrent": 7, "max_queue": 9}}},
    "jobs": {"caps": {"max_steps": 42}, "sandbox": {"max_processes": 99}},
    "tuning": {"min_speedup": 1.25},
    "log_level": "DEBUG",
}


def _check_sections(settings: Settings) -> None:
    assert settings.gateway.max_tokens_limit == 4096 and settings.gateway.docs
    assert settings.tiers["standard"].long_context_endpoints == ["http://10.1.2.3:8000"]  # type: ignore[index]
    assert settings.profiles["standard"].kv_cache_gib == 3  # type: ignore[index]
    assert settings.health.timeout_seconds == 1.5
    assert settings.timeouts.connect_seconds == 3.5
    assert settings.routing.prefix_chars == 256
    assert settings.policy.auto_tier == "headroom"
    assert settings.limits.chars_per_token == 3.0
    assert settings.admission.tiers["fast"].max_concurrent == 7  # type: ignore[index]
    assert settings.jobs.caps.max_steps == 42 and settings.jobs.sandbox.max_processes == 99
    assert settings.tuning.min_speedup == 1.25
    assert settings.log_level == "DEBUG"


def test_every_settings_section_reaches_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every top-level field of the settings tree has a value above (auth's keys come from
    # the Secret: checked elsewhere; a key in gateway.config is refused).
    assert set(SECTION_VALUES) == set(Settings.model_fields)
    sections = {k: v for k, v in SECTION_VALUES.items() if v != {}}
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "gateway": {"config": sections},
                # A worker's file has no tiers to merge a partial one with (the gateway's has).
                "jobs": {"worker": {"config": {k: v for k, v in sections.items() if k != "tiers"}}},
                # The tuner's profiles are the chart's (from vllm.tiers).
                "tuning": {
                    "config": {k: v for k, v in sections.items() if k not in ("tiers", "profiles")}
                },
            }
        )
    )
    docs = render(values)
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    _check_sections(gateway)
    # ... merged with what the chart derives, and the chart's own settings kept.
    assert gateway.tiers["standard"].dns is not None  # type: ignore[index]
    assert gateway.policy.fallback and gateway.gateway.metrics_port == 9090
    assert gateway.jobs.enabled and gateway.auth.enabled
    worker = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    worker.tiers = gateway.tiers
    _check_sections(worker)
    assert worker.jobs.worker.concurrency == 2 and worker.jobs.worker.metrics_port == 9400
    tuner = load_pod_settings(
        docs,
        "Job",
        next(d["metadata"]["name"] for d in docs if d["kind"] == "Job"),
        tmp_path,
        monkeypatch,
    )
    assert tuner.tuning.min_speedup == 1.25 and tuner.log_level == "DEBUG"
    assert tuner.profiles["fast"].tuned  # type: ignore[index]


def test_schema_is_generated_from_the_settings() -> None:
    on_disk = json.loads((CHART / "values.schema.json").read_text())
    fresh = chartschema.updated(on_disk)
    assert chartschema.render(fresh) == (CHART / "values.schema.json").read_text(), (
        "values.schema.json is out of date with tiergate/settings.py: "
        "run `python -m tiergate.chartschema`"
    )
    assert chartschema.main(["--check"]) == 0
    assert on_disk["$defs"]["Settings"]["properties"].keys() == Settings.model_fields.keys()
    for path in chartschema.SETTINGS_AT:
        node = on_disk
        for name in path:
            node = node["properties"][name]
        assert node["$ref"] == "#/$defs/Settings"


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("gateway.config.admission.auto_fast_headroom=2", "auto_fast_headroom"),
        ("gateway.config.gatewy.port=1", "gatewy"),
        ("jobs.worker.config.jobs.worker.concurrency=0", "concurrency"),
        ("tuning.config.tuning.min_speedup=0.5", "min_speedup"),
        ("auth.keys[0].name=nohash", "hash"),
        ("auth.keys[0].hash=md5:abc", "hash"),
        ("tuning.fastTier=maybe", "fastTier"),
        ("jobs.kafka.security.protocol=SASL", "protocol"),
    ],
)
def test_schema_refuses_wrong_settings(setting: str, complaint: str) -> None:
    stderr = render_fails(setting)
    assert "schema" in stderr and complaint in stderr, stderr


def test_extra_env_service_accounts_strategy_and_spread() -> None:
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
    }
    sets = []
    for prefix in ("gateway", "jobs.worker", "vllm"):
        sets += [
            f"{prefix}.extraEnv[0].name=EXTRA",
            f"{prefix}.extraEnv[0].value=on",
            f"{prefix}.serviceAccount.annotations.role=r-{prefix}",
            f"{prefix}.strategy.type=Recreate",
            f"{prefix}.strategy.rollingUpdate=null",
            f"{prefix}.topologySpreadConstraints[0].maxSkew=1",
            f"{prefix}.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
            f"{prefix}.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            f"{prefix}.tolerations[0].key=k{prefix}",
            f"{prefix}.tolerations[0].operator=Exists",
            f"{prefix}.nodeSelector.pool=p{prefix}",
        ]
    docs = render(sets=tuple(sets))
    for name, prefix, account in [
        ("rel-tiergate-gateway", "gateway", "rel-tiergate-gateway"),
        ("rel-tiergate-worker", "jobs.worker", "rel-tiergate-worker"),
        ("rel-tiergate-vllm-standard", "vllm", "rel-tiergate-vllm"),
        ("rel-tiergate-vllm-fast", "vllm", "rel-tiergate-vllm"),
    ]:
        deployment = find(docs, "Deployment", name)["spec"]
        pod = deployment["template"]["spec"]
        assert {"name": "EXTRA", "value": "on"} in pod["containers"][0]["env"], name
        assert pod["serviceAccountName"] == account
        assert find(docs, "ServiceAccount", account)["metadata"]["annotations"] == {
            "role": f"r-{prefix}"
        }
        assert deployment["strategy"] == {"type": "Recreate"}, name
        assert pod["topologySpreadConstraints"] == [spread], name
        assert {"key": f"k{prefix}", "operator": "Exists"} in pod["tolerations"], name
        assert pod["nodeSelector"]["pool"] == f"p{prefix}", name


# --- Engines behind the gateway only -------------------------------------------------------


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


def _gate() -> ModuleType:
    path = CHART / "files" / "tier_decision.py"
    spec = importlib.util.spec_from_file_location("tier_decision", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuning_job_and_the_fast_tiers_gate() -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    tune = pod["containers"][0]
    assert tune["command"][:2] == ["tiergate", "tune"]
    env = {e["name"]: e.get("value") for e in tune["env"]}
    assert env["TIERGATE_GPU_NAME"] == "h100-80gb"
    assert "VLLM_API_KEY" not in env  # its engines are its own, on localhost
    hardware = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["nodeSelector"] == hardware
    assert tune["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["mountPath"]: m for m in tune["volumeMounts"]}
    assert not mounts["/models"].get("readOnly")
    fast = pod_spec(docs, "Deployment", "rel-tiergate-vllm-fast")
    assert fast["nodeSelector"] == hardware
    (gate,) = fast["initContainers"]
    assert gate["image"] == tune["image"]
    gate_env = {e["name"]: e.get("value") for e in gate["env"]}
    assert gate_env["TIERGATE_FAST_MODE"] == "values"
    assert gate_env["TIERGATE_GPU_NAME"] == env["TIERGATE_GPU_NAME"]
    assert json.loads(gate_env["TIERGATE_FAST_ARGS"]) == [
        a for a in fast["containers"][0]["args"] if a.startswith(("--model=", "--speculative"))
    ]
    assert "initContainers" not in pod_spec(docs, "Deployment", "rel-tiergate-vllm-standard")
    # The Job and the gate read one settings file; the decision lives on the model volume.
    config = find(docs, "ConfigMap", "rel-tiergate-tuning")["data"]
    assert config["tier_decision.py"] == (CHART / "files" / "tier_decision.py").read_text()
    tuning = yaml.safe_load(config["tiergate.yaml"])
    assert tuning["tuning"]["decision_file"] == (
        "/models/tiergate/decisions/h100-80gb/tier-decision.json"
    )
    assert tuning["profiles"]["standard"]["model"] == "/models/Llama-3.1-8B-Instruct"
    assert tuning["profiles"]["fast"]["tuned"] is True
    # A changed tuning input is a new Job (a Job's template cannot change).
    other = render(CHART / "ci" / "gpu-production.yaml", sets=("tuning.budgetSeconds=120",))
    assert (
        next(d for d in other if d["kind"] == "Job")["metadata"]["name"] != job["metadata"]["name"]
    )
    kinds = {d["kind"] for d in render(CHART / "ci" / "cpu-small.yaml")}
    assert "Job" not in kinds


def _decision(settings: Settings, chosen: Recipe | None) -> TierDecision:
    fingerprint = hardware_fingerprint()
    return TierDecision(
        fingerprint=fingerprint,
        fingerprint_digest=digest(fingerprint),
        inputs_digest=inputs_digest(settings),
        decided_at=0.0,
        seconds=1.0,
        engine_mode="compiled",
        chosen=chosen,
        verdict="faster" if chosen else "equal",
        reason="test",
    )


def _gate_setup(
    values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, dict[str, Any], Path]:
    docs = render(values)
    fast = pod_spec(docs, "Deployment", "rel-tiergate-vllm-fast")
    gate = fast["initContainers"][0]
    config = tmp_path / "tuning.yaml"
    config.write_text(find(docs, "ConfigMap", "rel-tiergate-tuning")["data"]["tiergate.yaml"])
    for item in gate["env"]:
        monkeypatch.setenv(item["name"], item["value"])
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))
    # The volume's path here instead of /models (an environment variable wins over the file).
    monkeypatch.setenv("TIERGATE_TUNING__DECISION_FILE", str(tmp_path / "tier-decision.json"))
    monkeypatch.setenv("TIERGATE_WAIT_SECONDS", "0.05")
    monkeypatch.setenv("TIERGATE_POLL_SECONDS", "0.01")
    return load_settings(), fast, tmp_path / "fast-args.json"


def test_the_gate_waits_for_an_agreeing_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _gate()
    settings, fast, out = _gate_setup(CHART / "ci" / "gpu-production.yaml", tmp_path, monkeypatch)
    decision_file = settings.tuning.decision_path()
    assert gate.main(["tier_decision.py", str(out)]) == 2  # no decision yet
    assert "no tier decision" in gate.waiting_for(settings)
    # Measured on other hardware: still waiting, and saying so.
    other = _decision(settings, None)
    other.fingerprint_digest = "0" * 16
    other.save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 2
    assert "measured on" in gate.waiting_for(settings)
    # A decision for another recipe than the values run: the fast tier refuses to start.
    eagle = {
        "method": "eagle3",
        "model": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    _decision(settings, Recipe(name="bf16 + eagle3", speculative=eagle)).save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 1
    assert not out.exists()
    # The decision agrees with the values (W4A16 + EAGLE-3): it starts, as configured.
    chosen = Recipe(name="W4A16 + eagle3", quantize="W4A16", speculative=eagle)
    _decision(settings, chosen).save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 0
    configured = [
        a for a in fast["containers"][0]["args"] if a.startswith(("--model=", "--speculative"))
    ]
    assert json.loads(out.read_text()) == configured


def test_the_gate_hands_vllm_the_decided_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _gate()
    settings, fast, out = _gate_setup(CHART / "ci" / "cpu-tuned.yaml", tmp_path, monkeypatch)
    container = fast["containers"][0]
    # The decided recipe replaces the values' model and speculation.
    assert container["command"][:2] == ["python3", "-c"]
    assert "/run/tiergate/fast-args.json" in container["command"][2]
    assert not any(a.startswith(("--model", "--speculative")) for a in container["args"])
    assert fast["nodeSelector"] == {"node.kubernetes.io/instance-type": "c6i.2xlarge"}
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    recipe = Recipe(name="bf16 + ngram", speculative=ngram)
    _decision(settings, recipe).save(settings.tuning.decision_path())
    assert gate.main(["tier_decision.py", str(out)]) == 0
    args = json.loads(out.read_text())
    assert args[0] == "--model=/models/SmolLM2-135M-Instruct"
    assert json.loads(args[1].split("=", 1)[1]) == ngram
    # The standard configuration itself: the standard checkpoint, no speculation.
    _decision(settings, None).save(settings.tuning.decision_path())
    assert gate.main(["tier_decision.py", str(out)]) == 0
    assert json.loads(out.read_text()) == ["--model=/models/SmolLM2-135M-Instruct"]


# --- Transport and identity ----------------------------------------------------------------

SASL = (
    "jobs.kafka.security.protocol=SASL_SSL",
    "jobs.kafka.security.saslMechanism=SCRAM-SHA-512",
    "jobs.kafka.security.existingSecret=kafka-credentials",
    "jobs.kafka.security.caKey=ca.crt",
    "jobs.kafka.replicationFactor=3",
    "jobs.worker.keda.enabled=true",
)


def test_kafka_sasl_tls_and_replication(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(sets=SASL)
    for name in ("rel-tiergate-gateway", "rel-tiergate-worker"):
        pod = pod_spec(docs, "Deployment", name)
        env = container_env(docs, pod["containers"][0])
        assert env["TIERGATE_JOBS__KAFKA__SASL_USERNAME"] == "tiergate"
        assert env["TIERGATE_JOBS__KAFKA__SASL_PASSWORD"] == "s3cret"
        volume = next(v for v in pod["volumes"] if v["name"] == "kafka-ca")
        assert volume["secret"] == {
            "secretName": "kafka-credentials",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }
        assert {"name": "kafka-ca", "mountPath": "/etc/tiergate/kafka", "readOnly": True} in pod[
            "containers"
        ][0]["volumeMounts"]
    for name in ("rel-tiergate-gateway", "rel-tiergate-worker"):
        config = yaml.safe_load(find(docs, "ConfigMap", name)["data"]["tiergate.yaml"])
        kafka = config["jobs"]["kafka"]
        assert kafka["security_protocol"] == "SASL_SSL"
        assert kafka["sasl_mechanism"] == "SCRAM-SHA-512"
        assert kafka["ssl_cafile"] == "/etc/tiergate/kafka/ca.crt"
        assert kafka["replication_factor"] == 3
    trigger = find(docs, "ScaledObject", "rel-tiergate-worker")["spec"]["triggers"][0]
    assert trigger["metadata"]["sasl"] == "scram_sha512"
    assert trigger["metadata"]["tls"] == "enable"
    auth = find(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])["spec"]
    assert {(r["parameter"], r["key"]) for r in auth["secretTargetRef"]} == {
        ("username", "username"),
        ("password", "password"),
        ("ca", "ca.crt"),
    }
    assert "SASL" in render_fails("jobs.kafka.security.protocol=SASL_SSL")
    production = render(CHART / "ci" / "gpu-production.yaml")
    trigger = find(production, "ScaledObject", "rel-tiergate-worker")["spec"]["triggers"][0]
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["authenticationRef"]
    # Plaintext brokers (the default): no credentials; topics replicated three times.
    plain = yaml.safe_load(
        find(render(), "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert plain["jobs"]["kafka"]["replication_factor"] == 3
    assert not {"security_protocol", "sasl_mechanism", "ssl_cafile"} & plain["jobs"]["kafka"].keys()
    for name in ("rel-tiergate-gateway", "rel-tiergate-worker"):
        kafka = load_pod_settings(docs, "Deployment", name, tmp_path, monkeypatch).jobs.kafka
        assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert (kafka.sasl_username, kafka.sasl_password) == ("tiergate", "s3cret")
        assert kafka.ssl_cafile == "/etc/tiergate/kafka/ca.crt"
        assert kafka.replication_factor == 3


def test_object_storage_through_workload_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/tiergate-jobs"}
    for name in ("rel-tiergate-gateway", "rel-tiergate-worker"):
        pod = pod_spec(docs, "Deployment", name)
        assert not any(e["name"].startswith("AWS_") for e in pod["containers"][0]["env"])
        account = find(docs, "ServiceAccount", pod["serviceAccountName"])
        assert account["metadata"]["annotations"] == role
    # Static keys remain possible, from a Secret.
    docs = render(
        sets=(
            "jobs.storage.staticCredentials.accessKeyId=AKIA",
            "jobs.storage.staticCredentials.secretAccessKey=shh",
        )
    )
    for name in ("rel-tiergate-gateway", "rel-tiergate-worker"):
        env = container_env(docs, pod_spec(docs, "Deployment", name)["containers"][0])
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIA", "shh")


def test_workers_under_a_sandboxed_runtime() -> None:
    docs = render(
        sets=(
            "jobs.worker.runtimeClassName=gvisor",
            "jobs.worker.seccompProfile.type=RuntimeDefault",
            "jobs.worker.appArmorProfile.type=RuntimeDefault",
        )
    )
    pod = pod_spec(docs, "Deployment", "rel-tiergate-worker")
    assert pod["runtimeClassName"] == "gvisor"
    security = pod["containers"][0]["securityContext"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["appArmorProfile"] == {"type": "RuntimeDefault"}
    default = pod_spec(render(), "Deployment", "rel-tiergate-worker")
    assert "runtimeClassName" not in default
    assert default["containers"][0]["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


# --- Versions ------------------------------------------------------------------------------


def test_vllm_image_is_one_the_version_matrix_lists() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tag = values["vllm"]["image"]["tag"]
    readme = (CHART / "README.md").read_text()
    matrix = readme[readme.index("## Versions") :]
    assert f"`{tag}`" in matrix
    for path in VALUES:
        image = (yaml.safe_load(path.read_text()).get("vllm") or {}).get("image") or {}
        assert image.get("tag", tag) in matrix, path.name
    # The tuning image is built on the same vLLM.
    assert (
        f"ARG VLLM_IMAGE=vllm/vllm-openai:{tag}"
        in (ROOT / "helm" / "images" / "tuner.Dockerfile").read_text()
    )

"""The chart's keys, shared limits and settings: auth on from Secrets, Redis, every
settings section reaching the pods, the schema generated from settings.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    VALUES,
    all_keys,
    find,
    load_pod_settings,
    pod_spec,
    render,
    render_fails,
    secret_values,
)
from tiergate import chartschema
from tiergate.gateway.access.auth import hash_key
from tiergate.settings import Settings


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda p: p.stem if p else "defaults")
def test_every_values_file_turns_keys_on(values: Path | None) -> None:
    docs = render(*([values] if values else []))
    config = yaml.safe_load(
        find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert config["auth"] == {"enabled": True}
    # The keys reach the gateway as a mounted file (reloaded when the Secret changes).
    spec = pod_spec(docs, "Deployment", "rel-tiergate-gateway")
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["TIERGATE_AUTH__KEYS_FILE"] == "/etc/tiergate-auth/auth-keys"
    volume = next(v for v in spec["volumes"] if v["name"] == "auth-keys")
    assert volume["secret"]["items"] == [{"key": "auth-keys", "path": "auth-keys"}]


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
    by_hash = {k.hash: k for k in all_keys(gateway)}
    worker = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    # The workers' key reaches them as a mounted file (read again when it changes).
    assert worker.jobs.worker.api_key is None and worker.jobs.worker.api_key_file
    assert Path(worker.jobs.worker.api_key_file).read_text() == worker_key
    entry = by_hash[hash_key(worker_key)]
    assert entry.name == "job-workers" and entry.acts_for_job_owners
    # Client keys from values join it, as hashes.
    team = hash_key("tg-team-a")
    docs = render(sets=("auth.keys[0].name=team-a", f"auth.keys[0].hash={team}"))
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    assert [k.name for k in all_keys(gateway)] == ["team-a", "job-workers"]
    assert not all_keys(gateway)[0].acts_for_job_owners


def test_existing_secret_holds_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    assert not any(d["kind"] == "Secret" and d["metadata"]["name"].endswith("-auth") for d in docs)
    gateway = load_pod_settings(docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch)
    worker = load_pod_settings(docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch)
    assert {k.name for k in all_keys(gateway)} == {"team-a", "job-workers"}
    acting = {k.hash for k in all_keys(gateway) if k.acts_for_job_owners}
    assert worker.jobs.worker.api_key_file is not None
    assert acting == {hash_key(Path(worker.jobs.worker.api_key_file).read_text())}


@pytest.mark.parametrize(
    "public",
    [
        ("gateway.ingress.enabled=true",),
        (
            "gateway.service.type=LoadBalancer",
            "gateway.networkPolicy.from[0].ipBlock.cidr=203.0.113.0/24",
        ),
    ],
    ids=["ingress", "load-balancer"],
)
def test_public_gateway_without_keys_fails_to_render(public: tuple[str, ...]) -> None:
    complaint = render_fails("auth.enabled=false", "auth.insecureDisabled=true", *public)
    assert "auth.allowAnonymous" in complaint, complaint
    # An explicit choice renders, and the gateway then has no keys.
    docs = render(
        sets=(
            "auth.enabled=false",
            "auth.insecureDisabled=true",
            *public,
            "auth.allowAnonymous=true",
        )
    )
    config = yaml.safe_load(
        find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert config["auth"] == {"enabled": False}
    gateway = pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    assert "TIERGATE_AUTH__KEYS_FILE" not in {e["name"] for e in gateway["env"]}
    worker = pod_spec(docs, "Deployment", "rel-tiergate-worker")["containers"][0]
    names = {e["name"] for e in worker["env"]}
    assert not names & {"TIERGATE_JOBS__WORKER__API_KEY", "TIERGATE_JOBS__WORKER__API_KEY_FILE"}


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
    # `tiergate up`'s own servers: meaningless in a pod, but a file may carry it.
    "local": {"s3_port": 9001},
    "log_level": "DEBUG",
    # The process's own variables (tiergate/settings.py): a file may set them too, but the
    # config file itself is named by the pod's TIERGATE_CONFIG, and the metrics folder by
    # `serve --workers`.
    "config": {},
    "cache_dir": "/var/cache/tiergate",
    "quant_python": "/opt/quant/bin/python",
    "gpu_name": "l4-24gb",
    "prometheus_multiproc_dir": {},
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
    assert settings.local.s3_port == 9001
    assert settings.log_level == "DEBUG"
    assert str(settings.cache_dir) == "/var/cache/tiergate" and settings.gpu_name == "l4-24gb"
    assert str(settings.quant_python) == "/opt/quant/bin/python"


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
    # Each field by the name a file gives it (prometheus_client's folder: its variable's).
    named = [str(f.validation_alias or n) for n, f in Settings.model_fields.items()]
    assert list(on_disk["$defs"]["Settings"]["properties"]) == named
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

"""Rendering the chart and reading what it rendered, for the chart's tests.

The helm binary comes from scripts/install-helm.sh (run by the bootstrap); its absence is
a failure, not a skip.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import TypeAdapter

from tiergate.accesssettings import ApiKey
from tiergate.gateway.access.auth import hash_key
from tiergate.settings import Settings, load_settings

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
# What the existing Secrets that ci/gpu-production.yaml names hold (auth, engines, Redis,
# Kafka).
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
    "tiergate-engine": {"engine-api-key": "engine-key-from-an-existing-secret-0123456789"},
    "tiergate-redis": {"redis-password": "redis-password-from-an-existing-secret"},
    "kafka-credentials": {"username": "tiergate", "password": "s3cret", "ca.crt": "PEM"},
}
# What the chart's defaults leave to the installer (a seed for the secrets the chart makes,
# the object store's addresses for the workers' egress, the brokers' credentials), given to
# a render unless one of
# the ci/*.yaml files, which carry their own, is among its values. Later sets win.
SEED = "tests-seed-0123456789abcdef0123456789abcdef"
REQUIRED = (
    f"secretSeed={SEED}",
    "jobs.storage.cidrs[0]=10.0.64.0/24",
    "jobs.kafka.security.existingSecret=kafka-credentials",
)


def helm() -> str:
    found = shutil.which("helm", path=str(ROOT / ".venv" / "bin")) or shutil.which("helm")
    assert found, "helm is missing: run scripts/install-helm.sh (the bootstrap does)"
    return found


def template_args(
    values: tuple[Path, ...], sets: tuple[str, ...], required: bool = True
) -> list[str]:
    """helm template's arguments; REQUIRED first unless a ci/*.yaml file (which carries
    its own) is among the values."""
    args = [helm(), "template", "rel", str(CHART), "--namespace", "llm"]
    for path in values:
        args += ["-f", str(path)]
    defaults = required and not any(path in VALUES for path in values)
    for item in (REQUIRED if defaults else ()) + sets:
        args += ["--set", item]
    return args


def render_text(*values: Path, sets: tuple[str, ...] = (), required: bool = True) -> str:
    """What helm template prints."""
    args = template_args(values, sets, required)
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(
    *values: Path, sets: tuple[str, ...] = (), required: bool = True
) -> list[dict[str, Any]]:
    out = render_text(*values, sets=sets, required=required)
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


def mount_secret_files(
    docs: list[dict[str, Any]],
    spec: dict[str, Any],
    container: dict[str, Any],
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Write the Secret volumes ``container`` mounts under ``tmp_path``, as the kubelet
    would, and point the environment's paths into them there."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        data = secret_values(docs, secret["secretName"])
        items = secret.get("items") or [{"key": k, "path": k} for k in data]
        where = tmp_path / "secrets" / mount["name"]
        where.mkdir(parents=True, exist_ok=True)
        for item in items:
            (where / item["path"]).write_text(data[item["key"]])
        for name, value in env.items():
            if value.startswith(mount["mountPath"] + "/"):
                env[name] = str(where / value.removeprefix(mount["mountPath"] + "/"))


def all_keys(settings: Settings) -> list[ApiKey]:
    """The keys a gateway with ``settings`` starts with: its own and its keys file's."""
    keys = list(settings.auth.keys)
    if settings.auth.keys_file:
        keys += TypeAdapter(list[ApiKey]).validate_json(Path(settings.auth.keys_file).read_text())
    return keys


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
    mount_secret_files(docs, spec, box, env, tmp_path)
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
    spec = pod_spec(docs, "Deployment", "rel-tiergate-gateway")
    gateway = spec["containers"][0]
    env = container_env(docs, gateway)
    mount_secret_files(docs, spec, gateway, env, tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "tiergate.yaml"
    config.write_text(find(docs, "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"])
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))


def render_fails(*sets: str, values: tuple[Path, ...] = (), required: bool = True) -> str:
    """helm template's complaint for values it must refuse."""
    proc = subprocess.run(
        template_args(values, sets, required), capture_output=True, text=True, check=False
    )
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

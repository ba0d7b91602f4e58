"""Production transport and identity: Kafka SASL/TLS, workload identity, sandboxed
runtimes, and the vLLM version the chart names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    ROOT,
    VALUES,
    container_env,
    find,
    load_pod_settings,
    pod_spec,
    render,
    render_fails,
)

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
    production = render(CHART / "ci" / "gpu-production.yaml")
    trigger = find(production, "ScaledObject", "rel-tiergate-worker")["spec"]["triggers"][0]
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["authenticationRef"]
    # Plaintext brokers, said to be intended: no credentials; topics replicated three times.
    insecure = (
        "jobs.kafka.security.protocol=PLAINTEXT",
        "jobs.kafka.security.insecurePlaintext=true",
    )
    plain = yaml.safe_load(
        find(render(sets=insecure), "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
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
    assert default["containers"][0]["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "tiergate/bwrap.json",
    }


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


def test_the_image_is_built_on_a_pinned_python_and_debian() -> None:
    """Issue 33: the base image's tag floated (python:3.11-slim), so which Python, and so
    which tarfile, the workers ran was not known. Every stage is built on one pinned
    patch release of a named Debian release."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    [arg] = [line for line in dockerfile.splitlines() if line.startswith("ARG PYTHON_IMAGE=")]
    image = arg.removeprefix("ARG PYTHON_IMAGE=")
    name, _, tag = image.partition(":")
    version, _, variant = tag.partition("-")
    assert name == "python" and variant == "slim-bookworm", image
    major, minor, patch = (int(part) for part in version.split("."))
    assert (major, minor) == (3, 11) and patch >= 13, image  # 3.11.13: CVE-2025-4517's fix
    stages = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert stages and all(line.split()[1] == "${PYTHON_IMAGE}" for line in stages), stages


def test_kafka_is_sasl_over_tls_unless_plaintext_is_said_to_be_intended() -> None:
    """The default transport is SASL_SSL, and a render without the brokers' credentials
    fails naming where they go; PLAINTEXT (jobs and their owners in the clear, and any pod
    that reaches the brokers queueing jobs) needs insecurePlaintext."""
    said = render_fails("jobs.kafka.security.existingSecret=")
    assert "SASL_SSL (the default)" in said and "components.gateway" in said, said
    said = render_fails("jobs.kafka.security.protocol=PLAINTEXT")
    assert "insecurePlaintext=true" in said, said
    gateway = yaml.safe_load(
        find(render(), "ConfigMap", "rel-tiergate-gateway")["data"]["tiergate.yaml"]
    )
    assert gateway["jobs"]["kafka"]["security_protocol"] == "SASL_SSL"


def test_each_component_can_have_its_own_kafka_user_and_storage_keys() -> None:
    """Least privilege: the gateway, the workers and KEDA each name their own Kafka Secret
    (KEDA's defaults to the workers'), the gateway, the workers and the environments build
    their own storage keys; the environments build, which reaches no broker, gets no Kafka
    credentials at all; a component left without a Kafka Secret is refused by name."""
    own = (
        "jobs.kafka.security.existingSecret=",
        "jobs.kafka.security.caKey=ca.crt",
        "jobs.kafka.security.components.gateway=kafka-gateway",
        "jobs.kafka.security.components.worker=kafka-worker",
        "jobs.worker.keda.enabled=true",
        "jobs.storage.staticCredentials.components.gateway=s3-gateway",
        "jobs.storage.staticCredentials.components.worker=s3-worker",
        "jobs.storage.staticCredentials.components.environments=s3-envs",
        "jobs.environments.build.enabled=true",
    )
    docs = render(sets=own)

    def refs(kind: str, name: str) -> dict[str, str]:
        pod = pod_spec(docs, kind, name)
        env = pod["containers"][0].get("env", [])
        return {
            e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
            for e in env
            if "secretKeyRef" in e.get("valueFrom", {})
        }

    gateway = refs("Deployment", "rel-tiergate-gateway")
    worker = refs("Deployment", "rel-tiergate-worker")
    assert gateway["TIERGATE_JOBS__KAFKA__SASL_PASSWORD"] == "kafka-gateway"
    assert worker["TIERGATE_JOBS__KAFKA__SASL_PASSWORD"] == "kafka-worker"
    assert (gateway["AWS_SECRET_ACCESS_KEY"], worker["AWS_SECRET_ACCESS_KEY"]) == (
        "s3-gateway",
        "s3-worker",
    )
    for name, secret in (
        ("rel-tiergate-gateway", "kafka-gateway"),
        ("rel-tiergate-worker", "kafka-worker"),
    ):
        volume = next(
            v for v in pod_spec(docs, "Deployment", name)["volumes"] if v["name"] == "kafka-ca"
        )
        assert volume["secret"]["secretName"] == secret
    trigger = find(docs, "TriggerAuthentication", "rel-tiergate-kafka")["spec"]["secretTargetRef"]
    assert {r["name"] for r in trigger} == {"kafka-worker"}
    keda = render(sets=(*own, "jobs.kafka.security.components.keda=kafka-keda"))
    trigger = find(keda, "TriggerAuthentication", "rel-tiergate-kafka")["spec"]["secretTargetRef"]
    assert {r["name"] for r in trigger} == {"kafka-keda"}
    build = [d for d in docs if d["kind"] == "Job" and "environments" in d["metadata"]["name"]]
    assert build, [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    env = {e["name"]: e for e in build[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not [n for n in env if n.startswith("TIERGATE_JOBS__KAFKA__SASL")], env
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-envs"
    said = render_fails(*own[:3])
    assert "the worker's Kafka credentials" in said and "components.worker" in said, said

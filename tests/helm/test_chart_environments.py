"""The chart's environment build Job (tiergate.envs): off by default; on, a hook Job runs
``tiergate env build`` as root for each manifest from values, with the workers' storage
settings, and every manifest is one tiergate accepts."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from tests.helm.chart import K8S_VERSION, find, render
from tiergate.envs.manifest import Manifest


def test_environment_build_job_is_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if d["metadata"]["name"].endswith("-environments")]


def test_environment_build_job_builds_every_manifest(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "jobs": {
                    "environments": {
                        "build": {"enabled": True, "privileged": False},
                        "manifests": {"py": {"packages": ["python3-minimal", "git"]}},
                    }
                }
            }
        )
    )
    docs = render(values)
    config = find(docs, "ConfigMap", "rel-tiergate-environments")
    manifests = {k: Manifest.model_validate(yaml.safe_load(v)) for k, v in config["data"].items()}
    assert set(manifests) == {"default.yaml", "py.yaml"}
    assert manifests["py.yaml"].name == "py" and "git" in manifests["py.yaml"].packages
    job = find(docs, "Job", "rel-tiergate-environments")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "tiergate env build" in container["args"][0]
    assert container["securityContext"]["runAsUser"] == 0
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TIERGATE_CONFIG"]["value"] == "/etc/tiergate/tiergate.yaml"
    mounts = {v["name"] for v in pod["volumes"]}
    assert mounts == {"config", "manifests", "tmp"}

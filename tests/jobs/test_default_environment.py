"""The local stack's default environment (tiergate.local.environment): registered as
``default`` in a real object store (SeaweedFS) on the first start, reused on the next,
built again when its manifest changes, and then what a real worker runs a job that names
no environment in (bubblewrap, Kafka).

mmdebstrap is not run again here: the builder starts from the cached test build
(tests/jobs/envs.py) and appends the manifest's files, so two manifests give two digests.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.envs import cache_dir
from tests.jobstack import jobs_stack
from tiergate.envs.build import BuildError, Built, add_files, sha256_file
from tiergate.envs.ensure import Builder
from tiergate.envs.manifest import Manifest
from tiergate.envs.registry import Registry
from tiergate.jobsettings import JobsSettings
from tiergate.local.environment import (
    SHIPPED_MANIFEST,
    DefaultEnvironmentFailed,
    ensure_default_environment,
)
from tiergate.objectstore import ObjectStore

TERMINAL = ("completed", "failed", "cancelled", "incomplete")
MANIFEST = 'name: default\npackages: [jq]\nfiles: {{"/etc/motd": "{motd}\\n"}}\n'


def fake_build_from_cache(base: Built, calls: list[Manifest]) -> Builder:
    """A builder that records its calls and, instead of running mmdebstrap, copies the
    cached build and appends the manifest's files."""

    def fake_build(manifest: Manifest, out: Path) -> Built:
        calls.append(manifest)
        shutil.copyfile(base.path, out)
        add_files(out, manifest)
        return Built(manifest, out, sha256_file(out), out.stat().st_size, 0.0)

    return fake_build


def _trajectory(job: dict[str, Any]) -> list[dict[str, Any]]:
    text = httpx.get(job["artifacts"]["trajectory"]).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_default_is_built_once_reused_and_rebuilt_when_its_manifest_changes(
    built_env: Built,
    broker: str,
    s3: str,
    model: FakeVllm,
    tmp_path: Path,
) -> None:
    work = tmp_path / "cache" / "envs"
    manifest = tmp_path / "default.yaml"
    manifest.write_text(MANIFEST.format(motd="first"))
    builds: list[Manifest] = []
    said: list[str] = []
    fake_build = fake_build_from_cache(built_env, builds)
    with jobs_stack(
        broker, s3, model, tmp_path, jobs={"sandbox": {"cache_dir": cache_dir()}}
    ) as stack:
        registry = Registry(ObjectStore(stack.jobs.storage))
        first = ensure_default_environment(
            stack.jobs, manifest, said.append, fake_build, work_dir=work
        )
        assert len(builds) == 1 and builds[0].files == {"/etc/motd": "first\n"}
        resolved = registry.resolve("default")
        assert resolved is not None and resolved.digest == first.digest != built_env.digest
        unpacked = Path(stack.jobs.sandbox.cache_dir) / "envs" / first.digest / "rootfs"
        assert (unpacked / "etc/motd").read_text() == "first\n"

        again = ensure_default_environment(
            stack.jobs, manifest, said.append, fake_build, work_dir=work
        )
        assert len(builds) == 1, "the same manifest was built again"
        assert again.digest == first.digest
        assert any(f"reusing {first.digest[:12]}" in line for line in said), said

        # What the worker then does with a job that names no environment.
        model.behaviour.replies = ["```bash\ncat /etc/os-release; cat /etc/motd\n```", "DONE"]
        stack.start_worker()
        job = stack.submit(
            {"model": MODEL, "instruction": "x", "limits": {"max_steps": 3, "timeout_seconds": 60}}
        )
        done = stack.wait(job["id"], lambda j: j["status"] in TERMINAL, timeout=120)
        assert done["status"] == "completed", done
        assert done["environment"] == "default" and done["environment_digest"] == first.digest
        command = next(t for t in _trajectory(done) if t["type"] == "command")
        assert command["exit_code"] == 0, command
        assert "Debian GNU/Linux 12 (bookworm)" in command["output"], command["output"]
        assert command["output"].rstrip().endswith("first"), command["output"]

        manifest.write_text(MANIFEST.format(motd="second"))
        changed = ensure_default_environment(
            stack.jobs, manifest, said.append, fake_build, work_dir=work
        )
        assert len(builds) == 2 and builds[1].files == {"/etc/motd": "second\n"}
        assert changed.digest != first.digest
        resolved = registry.resolve("default")
        assert resolved is not None and resolved.digest == changed.digest
        assert any("built from another manifest" in line for line in said), said


def test_a_failed_build_stops_the_stack_with_its_reason(s3: str, tmp_path: Path) -> None:
    jobs = JobsSettings.model_validate(
        {
            "storage": {"endpoint_url": s3, "bucket": f"envs-{uuid.uuid4().hex[:10]}"},
            "sandbox": {"cache_dir": str(tmp_path / "cache")},
        }
    )
    ObjectStore(jobs.storage).ensure_bucket()

    def failing_build(manifest: Manifest, out: Path) -> Built:
        raise BuildError("mmdebstrap failed (exit 1)")

    with pytest.raises(DefaultEnvironmentFailed) as failed:
        ensure_default_environment(
            jobs, SHIPPED_MANIFEST, lambda line: None, failing_build, work_dir=tmp_path / "envs"
        )
    assert "mmdebstrap failed (exit 1)" in str(failed.value)
    assert "--no-default-environment" in str(failed.value)
    assert Registry(ObjectStore(jobs.storage)).resolve("default") is None

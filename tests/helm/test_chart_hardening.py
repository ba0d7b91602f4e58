"""The chart's least-privilege rules (issue 22): secrets never in ConfigMaps, keys reloaded
from their mounted Secret, workers' egress to named addresses only, workers under the
chart's seccomp and AppArmor profiles, and worker pods with memory beside their jobs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm import chart
from tiergate.jobsettings import JobCaps

PASSWORD = "hunter2-in-the-url"
GATEWAY, WORKER = "rel-tiergate-gateway", "rel-tiergate-worker"


def _config_maps_text(docs: list[dict[str, Any]]) -> str:
    return json.dumps([d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"])


def test_a_redis_password_never_reaches_a_config_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://:{PASSWORD}@cache.example:6379/0"
    docs = chart.render(sets=(f"limits.redisUrl={url}",))
    assert PASSWORD not in _config_maps_text(docs)
    gateway = chart.pod_spec(docs, "Deployment", "rel-tiergate-gateway")["containers"][0]
    ref = next(e for e in gateway["env"] if e["name"] == "TIERGATE_LIMITS__REDIS_URL")
    assert ref["valueFrom"]["secretKeyRef"] == {
        "name": "rel-tiergate-redis-url",
        "key": "redis-url",
    }
    settings = chart.load_pod_settings(
        docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch
    )
    assert settings.limits.redis_url == url
    # Nor in the environment's plain values, nor the chart's Redis password.
    assert PASSWORD not in json.dumps(gateway)
    chart_redis = chart.render()
    password = chart.container_env(
        chart_redis,
        chart.pod_spec(chart_redis, "Deployment", "rel-tiergate-gateway")["containers"][0],
    )["REDIS_PASSWORD"]
    assert password not in _config_maps_text(chart_redis)


def _has_workers(docs: list[dict[str, Any]], values: Path | None) -> bool:
    """Whether the render has workers: exactly when its values leave jobs on (the checks
    below then apply); a render with jobs off must have none."""
    jobs = (yaml.safe_load(values.read_text()) if values else {}).get("jobs") or {}
    wanted = jobs.get("enabled", True)
    found = any(d["metadata"]["name"] == "rel-tiergate-worker" for d in docs)
    assert found == wanted, (values, wanted, found)
    return found


@pytest.mark.parametrize("values", [None, *chart.VALUES], ids=lambda p: p.stem if p else "defaults")
def test_workers_reach_no_address_but_the_named_ones(values: Path | None) -> None:
    docs = chart.render(*([values] if values else []))
    if not _has_workers(docs, values):
        return
    policy = chart.find(docs, "NetworkPolicy", "rel-tiergate-worker")["spec"]
    cidrs = [p["ipBlock"]["cidr"] for r in policy["egress"] for p in r["to"] if "ipBlock" in p]
    assert cidrs and not any(c.endswith("/0") for c in cidrs), cidrs
    assert all(r.get("ports") for r in policy["egress"]), "every egress rule names its ports"


def test_in_cluster_stores_by_their_pods_and_every_address_refused() -> None:
    store = {"app.kubernetes.io/name": "minio"}
    docs = chart.render(
        sets=(
            "jobs.storage.cidrs=null",
            "jobs.storage.peers[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=minio",
            "jobs.storage.port=9000",
        )
    )
    rules = chart.find(docs, "NetworkPolicy", "rel-tiergate-worker")["spec"]["egress"]
    assert {
        "to": [{"podSelector": {"matchLabels": store}}],
        "ports": [{"protocol": "TCP", "port": 9000}],
    } in rules
    assert "every address" in chart.render_fails("jobs.storage.cidrs[0]=0.0.0.0/0")
    assert "every address" in chart.render_fails("jobs.kafka.cidrs[0]=::/0")
    assert "name its addresses" in chart.render_fails("jobs.kafka.peers=null")


def test_workers_run_under_the_charts_profiles_unless_told_otherwise() -> None:
    docs = chart.render()
    security = chart.pod_spec(docs, "Deployment", "rel-tiergate-worker")["containers"][0][
        "securityContext"
    ]
    assert security["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "tiergate/bwrap.json",
    }
    assert security["appArmorProfile"] == {
        "type": "Localhost",
        "localhostProfile": "tiergate-bwrap",
    }
    # What the nodes install comes with the release, the same as the chart's files.
    profiles = chart.find(docs, "ConfigMap", "rel-tiergate-worker-profiles")["data"]
    seccomp = json.loads(profiles["seccomp-tiergate-bwrap.json"])
    assert seccomp == json.loads((chart.CHART / "files/seccomp/tiergate-bwrap.json").read_text())
    assert "profile tiergate-bwrap " in profiles["apparmor-tiergate-bwrap"]
    # Unconfined only when asked for.
    opted = chart.render(sets=("jobs.worker.seccompProfile.type=Unconfined",))
    security = chart.pod_spec(opted, "Deployment", "rel-tiergate-worker")["containers"][0][
        "securityContext"
    ]
    assert security["seccompProfile"]["type"] == "Unconfined"


def test_the_seccomp_profile_lets_bubblewrap_make_its_namespaces() -> None:
    profile = json.loads((chart.CHART / "files/seccomp/tiergate-bwrap.json").read_text())
    denied = {
        name
        for rule in profile["syscalls"]
        if rule["action"] != "SCMP_ACT_ALLOW"
        for name in rule["names"]
    }
    bubblewrap = {"clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "setns"}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and not denied & bubblewrap
    # What the runtime's default denies and bubblewrap does not need stays denied.
    assert {"bpf", "kexec_load", "init_module", "ptrace", "keyctl", "userfaultfd"} <= denied
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"} <= set(profile["architectures"])


# Loads a seccomp profile into this process the way runc does (names the architecture lacks
# skipped), then execs bubblewrap as the sandbox runs it: its own namespaces and mounts, and
# the sandbox's filter for the command inside.
_UNDER_PROFILE = """
import json, os, sys
import pyseccomp as sc
from tiergate.sandbox.seccomp import as_fd, compiled
inner = as_fd(compiled())
os.set_inheritable(inner, True)
profile = json.loads(sys.argv[1])
flt = sc.SyscallFilter(sc.ALLOW)
for rule in profile["syscalls"]:
    for name in rule["names"]:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
            flt.add_rule(sc.ERRNO(rule["errnoRet"]), name)
flt.load()
os.execvp("bwrap", ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
    "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/",
    "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--seccomp", str(inner),
    "--", "sh", "-c", "echo sandboxed"])
"""


def _bubblewrap_under(profile: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _UNDER_PROFILE, json.dumps(profile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bubblewrap_runs_the_sandbox_under_the_seccomp_profile() -> None:
    profile = json.loads((chart.CHART / "files/seccomp/tiergate-bwrap.json").read_text())
    ran = _bubblewrap_under(profile)
    assert ran.returncode == 0 and ran.stdout == "sandboxed\n", ran.stderr
    # The check can fail: with mount denied too, as the runtime's default denies it, the
    # same sandbox does not start.
    denying = {
        **profile,
        "syscalls": [*profile["syscalls"], {**profile["syscalls"][0], "names": ["mount"]}],
    }
    refused = _bubblewrap_under(denying)
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr


def test_the_apparmor_profile_parses() -> None:
    parser = shutil.which("apparmor_parser") or shutil.which("/usr/sbin/apparmor_parser")
    assert parser, "apparmor_parser is missing: scripts/bootstrap.sh installs apparmor"
    # -Q: compile only, load nothing into a kernel; -K: no cache.
    parsed = subprocess.run(
        [parser, "-Q", "-K", "-S", str(chart.CHART / "files/apparmor/tiergate-bwrap")],
        capture_output=True,
        check=False,
    )
    assert parsed.returncode == 0 and parsed.stdout, parsed.stderr.decode()


def _mebibytes(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(float(quantity[:-2]) * units[quantity[-2:]])


@pytest.mark.parametrize("values", [None, *chart.VALUES], ids=lambda p: p.stem if p else "defaults")
def test_worker_pods_have_memory_beside_their_jobs(
    values: Path | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = chart.render(*([values] if values else []))
    if not _has_workers(docs, values):
        return
    gateway = chart.load_pod_settings(
        docs, "Deployment", "rel-tiergate-gateway", tmp_path, monkeypatch
    )
    worker = chart.load_pod_settings(
        docs, "Deployment", "rel-tiergate-worker", tmp_path, monkeypatch
    )
    limit = chart.pod_spec(docs, "Deployment", "rel-tiergate-worker")["containers"][0]["resources"][
        "limits"
    ]["memory"]
    jobs = worker.jobs.worker.concurrency * gateway.jobs.caps.memory_mb
    assert _mebibytes(limit) >= jobs + 512


def test_values_that_leave_no_headroom_are_refused() -> None:
    # The chart's stand-in for the cap when gateway.config sets none is the settings' own.
    assert JobCaps().memory_mb == 4096
    complaint = chart.render_fails("jobs.worker.resources.limits.memory=8Gi")
    assert "leaves no headroom" in complaint and "8704 Mi" in complaint, complaint
    assert "leaves no headroom" in chart.render_fails("jobs.worker.concurrency=3")
    chart.render(sets=("jobs.worker.resources.limits.memory=8704Mi",))
    chart.render(sets=("jobs.worker.concurrency=3", "gateway.config.jobs.caps.memory_mb=2048"))
    headroom = chart.render_fails("jobs.worker.memoryHeadroomMi=2048")
    assert "jobs.worker.memoryHeadroomMi (2048)" in headroom

"""The soak's stack, arranged as the chart arranges it, on one machine: SeaweedFS (the
object store), Tansu (the broker) on it, Redis (the replicas' shared limits), two
stand-in engines (one per tier), two gateway replicas behind nginx (the chart's Service:
a connection refused goes to the other replica), two job workers. Every process runs in
a session of its own, so that a fault (SIGKILL, SIGSTOP) reaches what it started too, and
comes back (:meth:`SoakStack.restart`) on the same ports and data, as a pod's container
restarts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tiergate.bench.jobs.stack import child_env, jobs_tree
from tiergate.bench.soak.netdelay import DelayProxy
from tiergate.engine.command import vllm_command, vllm_environment
from tiergate.engine.process import healthy
from tiergate.gateway.access.auth import new_key
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.local.servers import (
    BROKER_BUCKET,
    ObjectStore,
    Server,
    broker,
    ensure_bucket,
    object_store,
)
from tiergate.measure.ports import free_port
from tiergate.queue.pipeline import JobQueue
from tiergate.settings import Settings
from tiergate.tiers import Tier
from tiergate.tuning.plan import Waiting, tier_plan

TENANTS = ("team-a", "team-b")
WORKSPACE_MB = 1024  # each worker's workspace volume, as the chart's emptyDir sizeLimit
FILLER = ".soak-filler"  # the file a "full disk" fault fills a workspace volume with
WORKER_UIDS = 4  # each worker's sandbox uid range: one per slot
WORKER_SLOTS = 3


@dataclass
class Keys:
    """The tenants' keys (by name), the workers' key, and the gateway's ``auth`` tree."""

    secrets: dict[str, str] = field(default_factory=dict)
    worker: str = ""
    auth: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(cls) -> Keys:
        keys = cls()
        entries: list[dict[str, Any]] = []
        for name in TENANTS:
            secret, digest = new_key()
            keys.secrets[name] = secret
            # Limits a soak's rates stay inside: a refusal is then a fault's doing.
            limits = {"requests_per_minute": 6000, "max_concurrent": 64}
            entries.append({"name": name, "hash": digest, "limits": limits})
        keys.worker, digest = new_key()
        entries.append({"name": "workers", "hash": digest, "acts_for_job_owners": True})
        keys.auth = {"enabled": True, "keys": entries}
        return keys


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _nginx_conf(work: Path, port: int, upstreams: list[int]) -> Path:
    """The chart's Service: round robin over the replicas, a replica that refuses
    connections passed over (``proxy_next_upstream error``: only before a byte of the
    request went out), nothing buffered (event streams pass as they come)."""
    servers = "\n".join(
        f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;" for p in upstreams
    )
    conf = work / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    client_max_body_size 0;
    upstream gateways {{
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_next_upstream error;
        }}
    }}
}}
""")
    return conf


class EngineServer(Server):
    """A vLLM server: ready when its ``/health`` answers (its port opens earlier)."""

    def ready(self) -> bool:
        return healthy(f"http://127.0.0.1:{self.port}")


@dataclass
class RealEngines:
    """Each tier's vLLM as this machine's settings and tier decision make it (the model
    and the decision in the cache ``make up`` filled); :attr:`model`, the served name."""

    settings: Settings
    model: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> RealEngines:
        model = settings.profiles[Tier.STANDARD].served_model_name
        return cls(settings, model)

    def server(self, tier: str, port: int, log: Path) -> Server:
        plan = tier_plan(self.settings, Tier(tier), parity="required")
        if isinstance(plan, Waiting):
            raise RuntimeError("no tier decision for this machine: run `make up` once first")
        profile = plan.profile.model_copy(update={"port": port, "host": "127.0.0.1"})
        env = {k: v for k, v in vllm_environment(profile).items() if k in _ENGINE_ENV}
        return EngineServer(f"engine-{tier}", vllm_command(profile), port, log, env)


# What the engine's environment sets over this process's (Server adds os.environ).
_ENGINE_ENV = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "LD_PRELOAD",
    "HF_HUB_OFFLINE",
    "VLLM_NO_USAGE_STATS",
)


class SoakStack:
    """The processes by name (``store``, ``broker``, ``redis``, ``engine-standard``,
    ``engine-fast``, ``gateway-1``, ``gateway-2``, ``worker-1``, ``worker-2``,
    ``service``); :attr:`url` is the Service's."""

    def __init__(
        self, work: Path, jobs: dict[str, Any] | None = None, engines: RealEngines | None = None
    ) -> None:
        """``engines``: vLLM for each tier as ``make up`` runs it (none: the stand-in)."""
        self.work = work
        self.engines = engines
        self.keys = Keys.make()
        self.store: ObjectStore = object_store(work / "s3", work / "seaweedfs.log")
        self.servers: dict[str, Server] = {}
        self.jobs_overrides = jobs or {}
        self.port = free_port()
        self.settings: JobsSettings | None = None
        self.metrics_ports: dict[str, int] = {}
        self.timeouts: dict[str, float] = {}  # each server's start, its restarts' too
        self.store_proxy: DelayProxy | None = None
        # Each worker's workspace volume (a tmpfs of WORKSPACE_MB where it can be mounted:
        # root), by worker; None where it could not be.
        self.workspaces: dict[str, Path | None] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> JobsSettings:
        self.store.start()
        self.servers["store"] = self.store
        self.timeouts["store"] = 60.0
        ensure_bucket(self.store.url, BROKER_BUCKET)
        # The gateways and workers reach the store through a proxy that a fault slows.
        self.store_proxy = DelayProxy(self.store.port).start()
        self._add(broker(free_port(), self.store.url, self.work / "tansu.log"), "broker")
        redis_port = free_port()
        redis_argv = [shutil.which("redis-server") or "redis-server", "--port", str(redis_port)]
        redis_argv += ["--bind", "127.0.0.1"]
        redis_argv += ["--save", "", "--appendonly", "no", "--dir", str(self.work)]
        self._add(Server("redis", redis_argv, redis_port, self.work / "redis.log"), "redis")
        engines = {}
        for tier in ("standard", "fast"):
            port = free_port()
            log = self.work / f"engine-{tier}.log"
            if self.engines is None:
                argv = _python("tiergate.bench.stub_model", str(port))
                server = Server(f"engine-{tier}", argv, port, log, child_env())
                self._add(server, f"engine-{tier}")
            else:
                self._add(self.engines.server(tier, port, log), f"engine-{tier}", timeout=900)
            engines[tier] = f"http://127.0.0.1:{port}"
        jobs = jobs_tree(
            self.servers["broker"].address,
            self.store_proxy.url,
            self.url,
            self.work,
            outstanding=400,
            assignment="cooperative-sticky",
            batch_poll_seconds=1.0,
        )
        jobs["max_outstanding_jobs"] = 1000
        for key, value in self.jobs_overrides.items():
            merged = isinstance(value, dict) and isinstance(jobs.get(key), dict)
            jobs[key] = {**jobs[key], **value} if merged else value
        settings = JobsSettings.model_validate(jobs)
        JobStore(settings.storage).ensure_bucket()
        JobQueue(settings.kafka).ensure_topics()
        gateway_ports = [free_port(), free_port()]
        for i, port in enumerate(gateway_ports, 1):
            config = self.work / f"gateway-{i}.yaml"
            self.metrics_ports[f"gateway-{i}"] = metrics = free_port()
            tree = {
                "tiers": {t: {"endpoints": [u]} for t, u in engines.items()},
                "gateway": {"port": port, "metrics_port": metrics, "log_requests": False},
                "limits": {"redis_url": f"redis://127.0.0.1:{redis_port}/0"},
                "jobs": jobs,
                "auth": self.keys.auth,
            }
            config.write_text(yaml.safe_dump(tree))
            server = Server(
                f"gateway-{i}",
                _python("tiergate", "serve"),
                port,
                self.work / f"gateway-{i}.log",
                child_env(config),
            )
            self._add(server, f"gateway-{i}", timeout=90)
        for name in ("nginx-body", "nginx-proxy"):
            (self.work / name).mkdir(exist_ok=True)
        conf = _nginx_conf(self.work, self.port, gateway_ports)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        argv = [
            nginx,
            "-c",
            str(conf),
            "-p",
            str(self.work),
            "-e",
            str(self.work / "nginx-error.log"),
        ]
        self._add(Server("service", argv, self.port, self.work / "nginx.log"), "service")
        for i in (1, 2):
            self._add(self._worker(jobs, i), f"worker-{i}", timeout=90)
        self.settings = settings
        return settings

    def _worker(self, jobs: dict[str, Any], i: int) -> Server:
        tree = yaml.safe_load(yaml.safe_dump(jobs))
        port = free_port()
        self.metrics_ports[f"worker-{i}"] = port
        tree["worker"].update(metrics_port=port, concurrency=WORKER_SLOTS, api_key=self.keys.worker)
        workspace = self.work / f"workspaces-{i}"
        workspace.mkdir(mode=0o755, exist_ok=True)
        self.workspaces[f"worker-{i}"] = mount_small_volume(workspace, WORKSPACE_MB)
        tree["sandbox"].update(
            uid=100000 + WORKER_UIDS * i, uids=WORKER_UIDS, work_dir=str(workspace)
        )
        config = self.work / f"worker-{i}.yaml"
        config.write_text(yaml.safe_dump({"jobs": tree, "gateway": {"log_requests": False}}))
        env = child_env(config)
        return Server(
            f"worker-{i}", _python("tiergate", "worker"), port, self.work / "workers.log", env
        )

    def _add(self, server: Server, name: str, timeout: float = 60.0) -> None:
        server.start(timeout)
        self.servers[name] = server
        self.timeouts[name] = timeout

    def metrics_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"

    def pid(self, name: str) -> int | None:
        proc = self.servers[name].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill(self, name: str) -> None:
        """SIGKILL to the process's whole session (what it started too)."""
        self._signal(name, signal.SIGKILL)
        proc = self.servers[name].proc
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(10)

    def pause(self, name: str) -> None:
        self._signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self._signal(name, signal.SIGCONT)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        pid = self.pid(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def slow_store(self, delay: float) -> None:
        """Every chunk between the gateways or workers and the store waits ``delay`` s."""
        assert self.store_proxy is not None
        self.store_proxy.delay = delay

    def fill_workspace(self, worker: str) -> bool:
        """Fill the worker's workspace volume to its last byte; False where the worker
        has no volume of its own (not root: the machine's disk is not filled)."""
        volume = self.workspaces.get(worker)
        if volume is None:
            return False
        free = shutil.disk_usage(volume).free
        fd = os.open(volume / FILLER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, free)
            with contextlib.suppress(OSError):  # what fallocate left, written (unbuffered)
                while os.write(fd, b"\0" * 65536):
                    pass
        finally:
            os.close(fd)
        return True

    def free_workspace(self, worker: str) -> None:
        volume = self.workspaces.get(worker)
        if volume is not None:
            (volume / FILLER).unlink(missing_ok=True)

    def restart(self, name: str) -> None:
        """Start ``name`` again on its ports and data (a container's restart), with its
        first start's time allowed (a vLLM engine's compiled start: minutes)."""
        server = self.servers[name]
        server.stop(kill=True)
        server.start(self.timeouts.get(name, 90.0))

    def stop(self) -> None:
        order = ["worker-1", "worker-2", "service", "gateway-1", "gateway-2"]
        order += ["engine-standard", "engine-fast", "redis", "broker", "store"]
        for name in order:
            server = self.servers.get(name)
            if server is None:
                continue
            with contextlib.suppress(Exception):
                self.resume(name)
                server.stop()
        if self.store_proxy is not None:
            self.store_proxy.stop()
        for volume in self.workspaces.values():
            if volume is not None:
                subprocess.run(["umount", "-l", str(volume)], check=False, capture_output=True)


def mount_small_volume(path: Path, size_mb: int) -> Path | None:
    """A tmpfs of ``size_mb`` at ``path`` (root only); None where it cannot be mounted."""
    if os.geteuid() != 0:
        return None
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "soak-workspace", str(path)],
        check=False,
        capture_output=True,
    )
    return path if done.returncode == 0 else None

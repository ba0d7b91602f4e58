"""The one validated settings tree of tiergate.

Sources, highest priority first: keyword arguments (tests), environment variables
(``TIERGATE_`` prefix, ``__`` between nested names, e.g. ``TIERGATE_GATEWAY__PORT=9000``,
JSON for lists and objects), the YAML file named by ``TIERGATE_CONFIG``, then defaults.
The tree is built by :func:`load_settings` at process start, never at import.

Every environment variable tiergate reads is a field here, under the name it is set by:
the process's own (``TIERGATE_CONFIG``, ``TIERGATE_CACHE_DIR``, ``TIERGATE_QUANT_PYTHON``,
``TIERGATE_GPU_NAME``: the prefix and a root field's name) and prometheus_client's
``PROMETHEUS_MULTIPROC_DIR``. Code takes them from the tree it was handed, never from
``os.environ``. (Variables passed on to child processes, vLLM's among them, are theirs.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from tiergate.accesssettings import AdmissionSettings, AuthSettings, LimitSettings
from tiergate.enginesettings import TierProfile, TuningSettings, default_profiles
from tiergate.jobsettings import JobsSettings
from tiergate.sectionbase import Section as _Section
from tiergate.tiers import Tier

_REPO = Path(__file__).resolve().parents[1]


class SettingsError(Exception):
    """A setting is wrong; the message names it."""


class DnsDiscovery(_Section):
    """Endpoints found by resolving a (headless Service) name; every address is one endpoint."""

    name: str
    port: int = Field(8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    refresh_seconds: float = Field(10.0, gt=0)


class PoolSettings(_Section):
    """The endpoints of one tier: a static list, DNS discovery, or both. Endpoints also
    listed in ``long_context_endpoints`` serve the long-context lane only."""

    endpoints: list[str] = Field(default_factory=list)
    dns: DnsDiscovery | None = None
    long_context_endpoints: list[str] = Field(default_factory=list)
    # The engines' API key (vLLM's --api-key / VLLM_API_KEY): sent as
    # ``Authorization: Bearer`` on every request to this tier's servers. Never logged.
    api_key: str | None = Field(None, min_length=1, repr=False)

    @field_validator("endpoints", "long_context_endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {url!r} must start with http:// or https://")
        return [url.rstrip("/") for url in value]


class HealthSettings(_Section):
    """Active health checks and passive ejection."""

    interval_seconds: float = Field(2.0, gt=0)
    timeout_seconds: float = Field(2.0, gt=0)
    eject_after_failures: int = Field(3, ge=1)
    cooldown_seconds: float = Field(10.0, ge=0)


class TimeoutSettings(_Section):
    """Upstream timeouts: every upstream call has all three."""

    connect_seconds: float = Field(2.0, gt=0)
    first_byte_seconds: float = Field(120.0, gt=0)
    between_chunks_seconds: float = Field(30.0, gt=0)
    # The client's side: a relay write the client does not take within this long cuts the
    # answer, so a client that stops reading cannot hold its admission slot and lease.
    client_write_seconds: float = Field(30.0, gt=0)


class RoutingSettings(_Section):
    """Load-aware choice with prefix affinity."""

    prefix_chars: int = Field(512, ge=16)
    affinity_max_entries: int = Field(10_000, ge=1)
    # Affinity holds while the preferred endpoint's load is within this many requests of the
    # least loaded one: past that the prefix cache is worth less than the queueing it causes.
    affinity_load_slack: float = Field(4.0, ge=0)
    # The key of each tenant's vLLM cache_salt (tiergate.gateway.access.cachesalt says why):
    # the same on every replica keeps a tenant's prefix-cache hits across them; unset, each
    # process draws its own. The chart sets it from the engines' key. Never logged.
    cache_salt_secret: str | None = Field(None, min_length=1, repr=False)


def _default_fallback_order() -> dict[Tier, list[Tier]]:
    return {Tier.STANDARD: [Tier.FAST], Tier.FAST: [Tier.STANDARD]}


def _default_speculative_tiers() -> list[Tier]:
    return [Tier.FAST]


class PolicySettings(_Section):
    """How tiers are chosen and when the gateway moves a request between them.

    ``auto_tier`` serves ``service_tier: auto`` (and requests that name no tier): a fixed
    tier, or ``headroom``: the fast tier while it has headroom (see admission), else standard.
    """

    auto_tier: Literal["standard", "fast", "headroom"] = "standard"
    fallback: bool = True
    max_attempts: int = Field(3, ge=1)
    # Per tier, the tiers a request moves to, first that can take it, when its own cannot:
    # the key may not use it, its engines cannot serve the request, or (with ``fallback``)
    # none of its endpoints is healthy. Data rather than code, so that another tier (such
    # as OpenAI's flex) is a settings change.
    fallback_order: dict[Tier, list[Tier]] = Field(default_factory=_default_fallback_order)
    # Tiers whose engines may decode speculatively, and so refuse the sampling options
    # vLLM's speculative path refuses (min_p, logit_bias, logits_processors).
    speculative_tiers: list[Tier] = Field(default_factory=_default_speculative_tiers)
    # Every engine runs vLLM's priority scheduling (``--scheduling-policy priority``; the
    # local stack's do): each request then carries vLLM's ``priority``, its urgency
    # (tiergate.tiers: priority 0, default 1, flex and agent jobs 2), so a ``priority``
    # request is not queued behind standard ones on an engine they share, and sweeps go
    # last. Off, the engines keep vLLM's first-come order (an engine without priority
    # scheduling refuses a nonzero ``priority``). A caller's own ``priority`` is never sent.
    engine_priorities: bool = False
    # A request for the fast tier that its admission cannot take within
    # ``admission.priority_wait_seconds`` (queue full, or the wait over) is served at
    # standard speed and echoed ``default``, as OpenAI serves ``priority`` beyond its
    # capacity, rather than refused with 503. Off, it waits up to the tier's queue timeout.
    busy_downgrade: bool = True

    @model_validator(mode="after")
    def _orders(self) -> PolicySettings:
        for tier, order in self.fallback_order.items():
            if tier in order or len(set(order)) != len(order):
                raise ValueError(
                    f"policy.fallback_order.{tier.value}: names itself or a tier twice"
                )
        return self


class GatewaySettings(_Section):
    """The HTTP face."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_tokens_limit: int = Field(32_768, ge=1)
    log_requests: bool = True
    # The tuner's decision (what each tier runs and the evidence), shown at /v1/tiers and in
    # /metrics; the local stack points this at the decision it serves.
    tier_evidence_file: str | None = None
    # How each tier's engines run ("compiled" or "eager"), shown at /v1/tiers; the local
    # stack fills it from the profiles it started. Unset: not claimed.
    engine_modes: dict[Tier, Literal["compiled", "eager"]] = Field(default_factory=dict)
    # /metrics names every key and every engine address: by default it is served only on a
    # second listener (this port, on ``metrics_host`` or else ``host``; same process and
    # registry; None: no such listener), and the serving port answers 404 for it unless
    # ``metrics_on_serving_port`` opts in.
    metrics_port: int | None = Field(9300, ge=0, le=65535)
    metrics_host: str | None = None
    metrics_on_serving_port: bool = False
    # /docs, /redoc and /openapi.json; off: 404.
    docs: bool = True
    # uvicorn's graceful shutdown: in-flight requests and streams get this long to finish.
    shutdown_grace_seconds: float = Field(30.0, ge=0)
    # Connections plus requests in progress past which uvicorn answers 503. None: half the
    # process's open-file limit (the soft RLIMIT_NOFILE, read at start), at most 8192: a
    # proxied request holds two descriptors (the client's and the engine's), and past the
    # limit the server could not accept at all (tiergate.gateway.serving.connection_cap).
    max_connections: int | None = Field(None, ge=1)
    # An idle keep-alive connection (between requests) is closed after this long.
    keep_alive_seconds: float = Field(5.0, gt=0)
    # A request's headers (the first on a connection, or the next on a kept-alive one,
    # counted from the previous response) must be complete within this long, else the
    # connection is closed: a client that sends nothing, or its headers byte by byte,
    # would hold a connection open for good (uvicorn has no such timeout). 10 s is ample
    # for any real client one LAN or Ingress hop away, whose headers leave in one send;
    # nginx's client_header_timeout is 60 s, for clients across the internet.
    header_read_timeout_seconds: float = Field(10.0, gt=0)
    # A request's whole body must arrive within this long after its headers, else 408.
    body_read_timeout_seconds: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _distinct_ports(self) -> GatewaySettings:
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError("gateway.metrics_port must differ from gateway.port")
        return self


def _default_tiers() -> dict[Tier, PoolSettings]:
    return {
        Tier.STANDARD: PoolSettings(endpoints=["http://127.0.0.1:8101"]),
        Tier.FAST: PoolSettings(endpoints=["http://127.0.0.1:8102"]),
    }


class LocalStackSettings(_Section):
    """Where ``tiergate up``'s own job servers listen on loopback: the object store
    (SeaweedFS), the broker (Tansu) and the worker's health and metrics. Something already
    answering on a port is reused (a stack started earlier), so a machine that runs another
    service there (MinIO on 9000, say) moves these."""

    s3_port: int = Field(9000, ge=1, le=65535)
    broker_port: int = Field(9092, ge=1, le=65535)
    worker_health_port: int = Field(9400, ge=1, le=65535)


class Settings(BaseSettings):
    """Root of the settings tree."""

    model_config = SettingsConfigDict(
        env_prefix="TIERGATE_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    # Where prepared models, logs, reports and the local stack's data live
    # (TIERGATE_CACHE_DIR). First: the profiles' and the decision's defaults are under it.
    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "tiergate")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    tiers: dict[Tier, PoolSettings] = Field(default_factory=_default_tiers)
    profiles: dict[Tier, TierProfile] = Field(
        default_factory=lambda data: default_profiles(data["cache_dir"])
    )
    health: HealthSettings = Field(default_factory=HealthSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)
    tuning: TuningSettings = Field(default_factory=TuningSettings)
    local: LocalStackSettings = Field(default_factory=LocalStackSettings)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # The process's own variables (the module's docstring). ``config``: the YAML file this
    # tree was read from (TIERGATE_CONFIG; only the environment names it).
    config: Path | None = None
    # The quantization environment's interpreter (scripts/install-quant.sh makes it).
    quant_python: Path = Field(default_factory=lambda: _REPO / ".venv-quant" / "bin" / "python")
    # The accelerator in the hardware fingerprint (the chart sets it from its values).
    gpu_name: str = Field("none", min_length=1)
    # Prometheus multiprocess mode's folder: set, /metrics adds up every process's files
    # (``tiergate serve --workers N`` sets it for its workers; prometheus_client reads it
    # too, under this name).
    prometheus_multiproc_dir: str | None = Field(None, validation_alias="PROMETHEUS_MULTIPROC_DIR")

    @field_validator("prometheus_multiproc_dir")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _both_tiers(self) -> Settings:
        missing = [t.value for t in Tier if t not in self.tiers]
        if missing:
            raise ValueError(f"tiers: missing pool for {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _decision_beside_the_models(self) -> Settings:
        if not self.tuning.decision_file:
            where = self.cache_dir / "models" / "tier-decision.json"
            self.tuning = self.tuning.model_copy(update={"decision_file": str(where)})
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        # The file is named by the environment alone (the tree's own reading of it).
        config_file = env_settings().get("config")
        if config_file:
            if not Path(config_file).is_file():
                raise SettingsError(f"TIERGATE_CONFIG: no such file: {config_file}")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings tree, turning validation errors into one readable message."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            if err["type"] == "default_factory_not_called":
                continue  # a default derived from a field that failed: that field says why
            where = ".".join(str(p) for p in err["loc"]) or "(root)"
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
        raise SettingsError("invalid settings:\n" + "\n".join(lines)) from exc

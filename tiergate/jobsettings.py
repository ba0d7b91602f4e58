"""The ``jobs`` part of the settings tree: the Kafka pipeline, object storage, the sandbox,
the workers and what a job may ask for. Re-exported by :mod:`tiergate.settings`, the one
settings tree."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tiergate.sectionbase import Section as _Section


class KafkaSettings(_Section):
    """The job pipeline's topics on a Kafka-protocol broker."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "tiergate-jobs"
    retry_topic: str = "tiergate-jobs-retry"
    dead_letter_topic: str = "tiergate-jobs-dead"
    group: str = "tiergate-workers"
    # OpenAI's Batch API: one record per chunk of a batch's lines (tiergate.jobs.lines),
    # read by every worker in a group of its own.
    batch_topic: str = "tiergate-openai-batches"
    batch_group: str = "tiergate-batch-workers"
    partitions: int = Field(8, ge=1)
    # A worker (re)joining pays about half of this before its first job (the broker holds
    # the join); a dead worker's jobs move to another after it. Heartbeats run in a thread,
    # so a long job does not lose its membership.
    session_timeout_ms: int = Field(6000, ge=1000)
    # How the group's partitions are shared out (kafka-python's assignors): "cooperative-
    # sticky" (KIP-429) moves only the partitions that change owner, in two rounds;
    # "range" and "roundrobin" take every partition back at each change, in one round.
    assignment: Literal["cooperative-sticky", "range", "roundrobin"] = "cooperative-sticky"
    request_timeout_seconds: float = Field(5.0, gt=0)
    # The workers' consumers' request timeout (kafka-python's request_timeout_ms; their
    # group joins wait longer on their own: the rebalance timeout plus 5 s). It bounds what
    # a broker that stops answering costs a worker's memory: kafka-python 3.0.12 busy-loops
    # while a fetch hangs and holds on to what each turn allocates until the fetch times
    # out (measured: about 20 MB a second on an AMD EPYC Zen 5, 540 MB per consumer at
    # kafka-python's default of 30 s, 130 MB at 10 s; tests/jobs/test_broker_stall_memory.py).
    consumer_request_timeout_seconds: float = Field(10.0, ge=1.0, le=300.0)
    # The largest message the producer sends (kafka-python's max_request_size); the gateway
    # refuses a job whose message would be over it with 413 before anything is written. The
    # broker's own limit (message.max.bytes) must be at least this.
    max_request_size: int = Field(1024 * 1024, ge=1024)
    # Copies of each partition when the topics are created (1 for one local broker).
    replication_factor: int = Field(1, ge=1)
    # Transport and identity for a production broker (kafka-python's names and values).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = Field(None, repr=False)
    ssl_cafile: str | None = None

    def client_options(self) -> dict[str, Any]:
        """The connection options every kafka-python client of the pipeline takes."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.ssl_cafile:
            options["ssl_cafile"] = self.ssl_cafile
        return options


class StorageSettings(_Section):
    """S3-compatible object storage for job state and artifacts."""

    endpoint_url: str | None = None
    bucket: str = "tiergate-jobs"
    region: str = "us-east-1"
    prefix: str = "jobs/"
    presign_seconds: int = Field(3600, ge=60)
    timeout_seconds: float = Field(3.0, gt=0)


class SandboxSettings(_Section):
    """Where and how commands run (bubblewrap)."""

    work_dir: str = "/var/lib/tiergate/jobs"
    # Environments (tiergate.envs) are unpacked once under <cache_dir>/envs/<digest>/rootfs;
    # the worker's user must be able to write it, the sandbox's user to traverse it.
    cache_dir: str = "/var/lib/tiergate/cache"
    output_limit_chars: int = Field(2000, ge=100)
    # Members a workspace archive may have when a worker unpacks it (refused over it, with
    # the job's disk_mb as the cap on its unpacked size): the worker's own check, whatever
    # the store holds (the gateway checks jobs.max_upload_members when it is uploaded).
    max_upload_members: int = Field(20_000, ge=1)
    # When the worker runs as root, sandboxed commands run as unprivileged users: job slot i
    # of the worker as uid ``uid + i`` and gid ``gid + i``, so that no two running jobs share
    # a user (a user's process count, RLIMIT_NPROC, is counted over all its processes: a
    # job at its limit would otherwise stop its neighbours from forking, and one job's
    # files would be another's). ``uids`` is the size of the range and must cover
    # ``worker.concurrency``; give each worker on one host a range of its own. The default
    # range has no names in /etc/passwd and nothing else on the host uses it.
    uid: int = Field(100000, ge=1)
    gid: int = Field(100000, ge=1)
    uids: int = Field(64, ge=1, le=65536)
    # Per-job cgroups go under <controller root>/<cgroup_parent>/job-<id>. As root the worker
    # creates the parent; an unprivileged worker needs it delegated (chowned to its user).
    cgroup_parent: str = Field("tiergate", pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
    # Where the cgroup filesystems are mounted (v2 there, or v1's memory/pids/cpu under it).
    cgroup_root: str = "/sys/fs/cgroup"
    # The explicit opt-out: run jobs without memory, CPU and process limits where no cgroup
    # can be created (the worker refuses to start without them otherwise).
    allow_unlimited: bool = False
    # The explicit opt-out: run jobs without the system-call filter where it cannot be built
    # (libseccomp missing); the worker refuses to start without it otherwise.
    allow_no_seccomp: bool = False
    max_processes: int = Field(256, ge=8, le=65536)
    # Files, directories and links a job's workspace may hold (inodes: empty files cost no
    # bytes but fill a disk's inode table); checked while each command runs, with the
    # job's disk_mb (tiergate.sandbox.diskwatch).
    max_workspace_entries: int = Field(100_000, ge=100)
    disk_watch_seconds: float = Field(0.2, gt=0)

    @field_validator("cgroup_parent")
    @classmethod
    def _below_the_root(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError("cgroup_parent is a relative path without '.' or '..'")
        return value

    def for_slot(self, index: int) -> SandboxSettings:
        """These settings for job slot ``index``: its own uid and gid in the range."""
        if not 0 <= index < self.uids:
            raise ValueError(f"job slot {index} is outside sandbox.uids ({self.uids})")
        return self.model_copy(update={"uid": self.uid + index, "gid": self.gid + index})


class WorkerSettings(_Section):
    concurrency: int = Field(2, ge=1, le=64)
    drain_seconds: float = Field(60.0, ge=0)
    max_attempts: int = Field(3, ge=1)
    retry_backoff_seconds: float = Field(5.0, ge=0)
    cancel_poll_seconds: float = Field(1.0, gt=0)
    api_key: str | None = None
    # The key in a file instead (the chart mounts its Secret there), which wins over
    # api_key: read again whenever it changes, and once more before retrying a call the
    # gateway answered 401, so that a rotated key is used without a restart.
    api_key_file: str | None = None
    protocol: Literal["text", "tools"] = "text"
    # GET /metrics and GET /healthz (tiergate.jobs.run.observe_http); port 0 picks a free one.
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(9400, ge=0, le=65535)
    # /healthz fails when an idle worker thread has not beaten for this long.
    heartbeat_stale_seconds: float = Field(120.0, gt=0)
    # A run's lease (tiergate.jobs.state.lease): beaten every third of this; a run whose beat
    # stopped this long (a worker killed, frozen or cut off from the store) is taken over
    # by the job's next pickup, and a run taken over writes nothing more.
    lease_seconds: float = Field(30.0, ge=1.0)
    # A worker with a free slot whose own partitions gave it nothing this long takes over
    # queued jobs from busy workers' partitions (tiergate.jobs.run.steal); 0 turns it off.
    # Only once its group assignment is known; a copy of a message whose attempt already
    # failed is skipped (the job's retry is the next attempt's message).
    steal_after_seconds: float = Field(2.0, ge=0)
    # /healthz shows the sandboxes' disk (sandbox.work_dir) as not ok below this many MiB
    # free (and the worker logs a warning): a job's workspace, outputs and archive need it.
    min_free_mb: int = Field(1024, ge=0)


class JobCaps(_Section):
    """The most a job may ask for on this installation (a request over it is refused)."""

    max_steps: int = Field(100, ge=1)
    timeout_seconds: float = Field(3600.0, gt=0)
    cpus: float = Field(2.0, gt=0)
    memory_mb: int = Field(4096, ge=16)
    disk_mb: int = Field(4096, ge=1)


class BreakerSettings(_Section):
    """Circuit breakers per environment (tiergate.jobs.state.breaker): consecutive
    infrastructure failures open one, shared by every worker through object storage."""

    enabled: bool = True
    # Consecutive infrastructure failures (setup, sandbox start, verifier crash) that open it.
    failures_to_open: int = Field(5, ge=1)
    # How long an open breaker fails jobs fast before one probe job may run.
    cooldown_seconds: float = Field(60.0, ge=0)
    # How long one probe may hold the half-open state: a probe job running longer (a
    # tenant's one-hour job) no longer stops every other job of the environment; the next
    # job picked up probes too.
    probe_seconds: float = Field(300.0, gt=0)


class FilesSettings(_Section):
    """OpenAI's Files API (``/v1/files``, tiergate.gateway.jobs.files), in the jobs' object
    storage. The limits are OpenAI's for a batch input file: 200 MB and 50,000 lines
    (requests), each line a JSON object; a key holds at most ``max_files_per_key`` files
    and ``quota_bytes`` of them (OpenAI's per-organisation storage is far larger; this is
    one installation's disk)."""

    max_file_bytes: int = Field(200 * 1000 * 1000, ge=1024)
    max_lines: int = Field(50_000, ge=1)
    max_files_per_key: int = Field(1000, ge=1)
    quota_bytes: int = Field(10 * 1024 * 1024 * 1024, ge=1024)


class BatchApiSettings(_Section):
    """OpenAI's Batch API (``/v1/batches``, tiergate.jobs.lines): a batch's lines are cut
    into chunks of ``chunk_lines``, each a record on ``kafka.batch_topic``; a worker runs a
    chunk's lines ``line_concurrency`` at a time through the gateway, at the agent jobs'
    urgency (after every interactive request), retrying the gateway's capacity answers
    (429, 503) for up to ``line_patience_seconds``. A key may have ``max_active_batches``
    unfinished, holding at most ``max_enqueued_requests`` lines and ``max_enqueued_tokens``
    (OpenAI's enqueued-token limit; estimated as the lines' bytes / limits.chars_per_token
    plus their max_tokens). A cancelled batch is final once its chunks in flight have
    ended, or after ``cancel_grace_seconds``."""

    # A worker runs one chunk at a time, so line_concurrency is at most chunk_lines. The
    # gateway's patient lane (admission.patient) decides how many lines the engines take
    # while interactive callers are about; these only bound what one worker offers.
    chunk_lines: int = Field(64, ge=1, le=1000)
    line_concurrency: int = Field(32, ge=1, le=64)
    line_timeout_seconds: float = Field(600.0, gt=0)
    line_patience_seconds: float = Field(900.0, gt=0)
    max_active_batches: int = Field(16, ge=1)
    max_enqueued_requests: int = Field(200_000, ge=1)
    max_enqueued_tokens: int = Field(100_000_000, ge=1)
    cancel_grace_seconds: float = Field(30.0, ge=0)
    completion_window_seconds: int = Field(24 * 3600, ge=1)
    # Batches refused at create for their input (status failed, kept with the lines' errors
    # as OpenAI does) that one key may make a day; past it the create is 429
    # too_many_failed_batches and nothing is stored: failed batches cost storage too.
    max_failed_batches_per_day: int = Field(100, ge=1)
    # How long a final batch (completed, failed, expired, cancelled) is kept; older ones go
    # when their owner next creates one (the owner's own call pays for it), at most
    # prune_per_create at a time. Its output and error files are files, kept as files are.
    retention_seconds: int = Field(30 * 24 * 3600, ge=3600)
    prune_per_create: int = Field(50, ge=1)

    @model_validator(mode="after")
    def _kept_past_the_window(self) -> BatchApiSettings:
        if self.retention_seconds < self.completion_window_seconds:
            raise ValueError(
                "jobs.batch_api.retention_seconds must be at least completion_window_seconds"
            )
        return self


class JobsSettings(_Section):
    """Agent jobs: Kafka in, sandboxed runs, results in object storage."""

    enabled: bool = False
    caps: JobCaps = Field(default_factory=JobCaps)
    # Unfinished jobs one key may have at once (a key's own limits.max_outstanding_jobs
    # overrides it).
    max_outstanding_jobs: int = Field(100, ge=1)
    max_upload_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # What one key may hold in live uploads (an expired one no longer counts), and how long
    # an upload may be named by a new job (gateway/jobs/uploads.py says when it is deleted).
    max_uploads_per_key: int = Field(100, ge=1)
    upload_quota_bytes: int = Field(1024 * 1024 * 1024, ge=1024)
    upload_ttl_seconds: float = Field(24 * 3600.0, gt=0)
    # What an upload's tar may hold, checked at upload before it is stored: members, and
    # the sum of their sizes (a small gzip may unpack to far more).
    max_upload_members: int = Field(20_000, ge=1)
    max_upload_unpacked_bytes: int = Field(4 * 1024 * 1024 * 1024, ge=1024)
    # The check's own bounds (tiergate/gateway/jobs/tarcheck.py), whatever the archive claims:
    # decompressed bytes at most this many times the compressed ones (past the first 16
    # MiB; zeros in bzip2 are a million to one, source trees about ten), and its time.
    max_upload_ratio: float = Field(1000.0, ge=1)
    upload_check_seconds: float = Field(60.0, gt=0)
    # Uploads one gateway replica receives at once (each spooled to its temporary directory,
    # up to max_upload_bytes: the chart's /tmp holds 8 of 64 MiB); the next is a 503.
    max_concurrent_uploads: int = Field(8, ge=1)
    # Of those, what one key may hold at once (429 too_many_concurrent_uploads past it):
    # eight slow uploads from one key, each held up to the body deadline, otherwise leave
    # every other key a 503 for as long.
    max_concurrent_uploads_per_key: int = Field(2, ge=1)
    # Event streams (GET /v1/jobs/{id}/events) one key may hold open on a gateway replica,
    # and the threads their storage polls run on (their own, not the creates').
    max_streams_per_key: int = Field(16, ge=1)
    stream_threads: int = Field(8, ge=1, le=256)
    # The threads the jobs, files and batches routes call object storage and the queue on,
    # their own (tiergate/gateway/jobs/threads.py): not the event loop's default pool, on
    # which the gateway resolves its engines' and Redis's addresses (six threads on a
    # two-core pod). A key holds at most max_reads_in_flight_per_key of them with reads,
    # so the default lets eight keys read at their most at once before a ninth waits.
    storage_threads: int = Field(32, ge=1, le=256)
    # What one owner's reads of its jobs and batches (GET, list, the event streams' polls,
    # a batch's rollouts export) may cost a minute, in read units: one per call to object
    # storage and one per 8 KiB read, what parsing it costs the gateway
    # (tiergate/gateway/access/readcost.py). A job's GET is about 3, a list of 100 about 300, one
    # read of a 20,000-rollout batch (7 MB) about 900: 30,000 (500 a second) polls a
    # thousand jobs every 6 s, or reads such a batch every 2 s at most (about 15% of a
    # core). Past it a GET is a 429 and a stream waits. Counted in Redis with
    # limits.redis_url (every replica together), else per replica; a key's
    # limits.read_units_per_minute overrides it.
    read_units_per_minute: int = Field(30_000, ge=1)
    # A key's reads running at once on one replica (a read is charged what it cost once it
    # has run): past it a GET is a 429 and a stream waits, so one key's flood of costly
    # reads holds at most this many of the storage threads while other keys' reads run.
    max_reads_in_flight_per_key: int = Field(4, ge=1)
    # The most of the fleet's running jobs one key may hold while another key's jobs wait
    # (1: no share; a key alone uses the whole fleet either way), how long a job over it
    # waits before its message comes back, and how often a worker lists who runs and who
    # waits (tiergate/jobs/state/share.py).
    fleet_share: float = Field(0.5, gt=0, le=1)
    fleet_share_retry_seconds: float = Field(5.0, gt=0)
    fleet_share_refresh_seconds: float = Field(2.0, ge=0)
    # A job still queued this long after it was accepted, with no worker having started it,
    # is sent again (its first message may never have reached the broker); the worker runs
    # a re-sent job only if it is still queued, so a slow queue does not run a job twice.
    requeue_after_seconds: float = Field(600.0, gt=0)
    # How often a worker schedules the rollout batches whose lease it holds.
    batch_poll_seconds: float = Field(2.0, gt=0)
    # Batches one key may have unfinished at once (each is read, scheduled and rewritten
    # by a worker every batch_poll_seconds; 429 too_many_batches past it), and the most
    # rollouts one batch may plan (tasks x samples, with the later rounds' extras, or its
    # budget.max_jobs if lower): its state, one object, holds every rollout.
    max_active_batches: int = Field(8, ge=1)
    # The largest tasks file (POST /v1/jobs/batches/tasks): a batch that names one is read
    # whole by the gateway that takes it.
    max_batch_tasks_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_batch_rollouts: int = Field(20_000, ge=1)
    gateway_url: str = "http://127.0.0.1:8000"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    files: FilesSettings = Field(default_factory=FilesSettings)
    batch_api: BatchApiSettings = Field(default_factory=BatchApiSettings)

    @model_validator(mode="after")
    def _a_uid_per_slot(self) -> JobsSettings:
        if self.sandbox.uids < self.worker.concurrency:
            raise ValueError(
                f"sandbox.uids ({self.sandbox.uids}) must be at least worker.concurrency "
                f"({self.worker.concurrency}): each running job has a uid of its own"
            )
        return self

"""Service settings, read from `OPD_*` environment variables (and a `.env` file).

Every path and the database URL default to places under `OPD_HOME`, so one variable
moves a whole installation; any of them can still be set on its own.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet
from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.pricing import Price
from kernel.tables.bounds import DEFAULT_MAX_UPLOAD_BYTES

ENV_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SELF_SERVER = "self"
"""OPD_TEACHER_SERVERS's word for a URL that is this service's own /v1 (reserved: never a
variable's name there)."""

DEFAULT_HOME = Path(".opd")
MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_MAX_SPEC_BYTES = 256 * 1024
POSTGRES_POOL_SIZE = 10
POSTGRES_MAX_OVERFLOW = 20
"""A process's Postgres pool by default (OPD_DB_POOL_SIZE, OPD_DB_MAX_OVERFLOW)."""
UNDER_HOME = {
    "database_url": "sqlite:///{home}/opd.db",
    "artifact_root": "{home}/artifacts",
    "data_root": "{home}/data",
    "model_cache": "{home}/cache/models",
    "storage_url": "{home}",
}
"""The settings that default to a place under OPD_HOME, and where (`{home}`)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OPD_", env_file=".env", extra="ignore", populate_by_name=True
    )

    home: Path = Field(DEFAULT_HOME, description="Service data directory.")
    database_url: str = Field(description="sqlite:///path or postgresql://user@host/db.")
    db_pool_size: int = Field(
        POSTGRES_POOL_SIZE,
        ge=1,
        le=1000,
        description="Postgres connections a pool keeps open (an API process has one pool, a "
        "worker two); all pools and overflows together must fit the server's max_connections.",
    )
    db_max_overflow: int = Field(
        POSTGRES_MAX_OVERFLOW,
        ge=0,
        le=1000,
        description="Postgres connections a pool may open beyond its size under load (closed "
        "again when returned).",
    )
    redis_url: str | None = Field(
        None, description="redis://host:port/db; unset = the service starts its own Redis."
    )
    queue_name: str = Field("opd:queue", min_length=1, description="arq queue of job ids.")
    artifact_root: Path = Field(description="Saved weights and states.")
    data_root: Path = Field(description="Dataset files jobs may read.")
    storage_url: str = Field(
        description="Where uploaded files (and, with a bucket, checkpoints) live: a folder, "
        "or s3://bucket/prefix with the endpoint and credentials in the usual AWS_* "
        "variables (a folder keeps them in its blobs/ folder)."
    )
    storage_retry_seconds: float = Field(
        60.0, gt=0, le=3600, description="How long a store call is retried with backoff."
    )
    max_upload_bytes: int = Field(
        DEFAULT_MAX_UPLOAD_BYTES,
        ge=1024,
        description="Largest file POST /v1/files accepts (streamed to disk); a table may "
        "unpack to four times as much.",
    )
    team_max_file_bytes: int = Field(
        10 * GIB, ge=1024, description="Bytes of uploaded files one team may keep."
    )
    team_max_stored_completions: int = Field(
        100_000,
        ge=1,
        description="Completions one team may keep (`store: true`); past it a request that "
        "asks to store one is a 429.",
    )
    team_max_spool_bytes: int = Field(
        2 * GIB,
        ge=1024,
        description="Bytes of uploads one team may have arriving at once in one API process "
        "(spooled to <home>/uploads); past it a 429.",
    )
    max_spool_bytes: int = Field(
        8 * GIB,
        ge=1024,
        description="Bytes of uploads all teams together may have arriving at once in one API "
        "process; past it a 429.",
    )
    presigned_downloads: bool = Field(
        False,
        description="With a bucket: GET /v1/files/{id}/content?redirect=true answers 307 to a "
        "presigned URL, which shows teams the bucket's endpoint, the store's prefix and the "
        "access key id; off, the bytes always come through the API.",
    )
    file_cache_bytes: int = Field(
        10 * GIB,
        ge=MIB,
        description="Bytes of uploaded files a worker keeps copies of (<home>/cache/files); "
        "the least recently used go first.",
    )
    checkpoint_cache_bytes: int = Field(
        20 * GIB,
        ge=MIB,
        description="With a bucket: bytes of checkpoints a worker or the API keeps copies of "
        "(<home>/cache/checkpoints); the least recently used go first.",
    )
    model_cache: Path = Field(
        description="Where a worker keeps GGUF models (a packaged preset such as "
        "smollm2-135m-instruct, or an operator's file) converted into Hugging Face folders, "
        "one per file's sha256."
    )
    worker_concurrency: int = Field(
        1,
        ge=1,
        le=1024,
        description="Jobs one worker runs at once (`opd serve`'s worker: one a CPU core, 2 "
        "to 4, unless this is set).",
    )
    heartbeat_interval: float = Field(5.0, gt=0, description="Seconds between heartbeats.")
    heartbeat_timeout: float = Field(
        60.0, gt=0, description="Seconds without a heartbeat after which a job is orphaned."
    )
    max_attempts: int = Field(
        5,
        ge=1,
        le=100,
        description="Attempts a job gets; a training call whose result was lost resumes the "
        "job from its last saved state until then.",
    )
    requeue_interval: float = Field(
        10.0,
        gt=0,
        validation_alias=AliasChoices("OPD_REQUEUE_INTERVAL", "OPD_SWEEP_INTERVAL"),
        description="Seconds between a worker's requeue passes: lost or orphaned jobs sent "
        "again, what a budget paused resumed, the worker's slots noted. (OPD_SWEEP_INTERVAL, "
        "its old name, beside OPD_SWEEPS_INTERVAL's hyperparameter sweeps, is read for one "
        "more release.)",
    )
    sweeps_interval: float = Field(
        2.0, gt=0, description="Seconds between a worker's passes over the running sweeps."
    )
    sweep_max_values: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Values a sweep's parameters may give in all (each listed value, and a "
        "range's two ends); each one is a spec checked when the sweep is created.",
    )
    migrate_on_start: bool = Field(True, description="Apply migrations when the API starts.")
    max_body_bytes: int = Field(MIB, ge=1024, description="Largest request body accepted.")
    max_spec_bytes: int = Field(
        DEFAULT_MAX_SPEC_BYTES,
        ge=16 * 1024,
        description="Largest job spec or sweep definition stored, as JSON (every road in: the "
        "API, the dashboard's YAML, a clone); a larger one is a 413. Every listing that shows "
        "them is bounded by it.",
    )
    stream_poll_interval: float = Field(
        1.0, gt=0, description="Seconds between database polls of a metrics stream."
    )
    team_max_streams: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Metric streams (SSE) of one team an API process holds open at once; one "
        "more is a 429 with Retry-After.",
    )
    max_streams: int = Field(
        128,
        ge=1,
        le=100_000,
        description="Metric streams an API process holds open at once, every team's "
        "together (each polls the database); one more is a 429 with Retry-After.",
    )
    auth_cache_seconds: float = Field(
        10.0, ge=0, description="How long a process trusts a checked API key; 0 = always check."
    )
    job_cache_seconds: float = Field(
        0.25,
        ge=0,
        description="How long GET /v1/jobs/{id} may serve a job read earlier; 0 = always read.",
    )
    connect_timeout: float = Field(
        2.0, gt=0, description="Seconds the API waits for Redis (and readiness probes) to answer."
    )
    sample_timeout: float = Field(
        60.0, gt=0, le=600, description="Seconds a playground request waits for a worker."
    )
    sample_concurrency: int = Field(
        2, ge=1, le=64, description="Playground tasks one worker process runs at once."
    )
    sampler_cache_entries: int = Field(
        4, ge=1, le=64, description="Sampling clients a worker keeps loaded for the playground."
    )
    sampler_cache_mb: float = Field(
        4096.0,
        gt=0,
        description="MiB the models a worker keeps or loads for the playground may hold; a "
        "larger model is refused (model_too_large).",
    )
    download_timeout: float = Field(
        600.0,
        gt=0,
        description="Seconds a checkpoint download waits for a worker to fetch a remote archive.",
    )
    team_max_waiting: int = Field(
        64,
        ge=1,
        le=4096,
        description="Completions of one team that may wait for a worker at once in each API "
        "process (a request counts its prompts x n x models; a checkpoint download counts "
        "one); past it a 429 with Retry-After, and a request asking for more alone is a 422. "
        "The default fits one /v1/completions request of 64 choices.",
    )
    session_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description="Signs dashboard sessions; unset = a random one kept in <home>/session-secret"
        " (set it when API processes on several machines share one dashboard).",
    )
    secret_key: SecretStr | None = Field(
        None,
        description="Fernet keys that encrypt secrets at rest (webhook signing secrets), "
        "comma-separated: the first encrypts, every one decrypts (rotation); unset = one "
        "generated into <home>/secret-key (set it when processes on several machines share "
        "one database).",
    )
    session_hours: float = Field(
        12.0, gt=0, le=24 * 30, description="How long a dashboard sign-in lasts."
    )
    metrics_listen: str | None = Field(
        None,
        pattern=r"^[^:\s]+:\d{1,5}$",
        description="host:port where the API also serves GET /metrics without a key "
        "(bind it to an address only Prometheus reaches); unset = only with an admin key.",
    )

    team_max_running: int | None = Field(
        None, ge=1, description="Jobs a team may run at once, unless set for it; unset = no limit."
    )
    team_max_queued: int | None = Field(
        None, ge=1, description="Jobs a team may have queued, unless set for it; unset = no limit."
    )
    prices: list[Price] = Field(
        default_factory=list,
        description="Price table (JSON list of {backend, model, sampled, scored, trained, "
        "eval} per million tokens) for estimated costs; empty = no cost is shown.",
    )
    mlflow_tracking_uris: list[str] = Field(
        default_factory=list,
        description="MLflow tracking servers jobs may be mirrored to (trackers.mlflow."
        "tracking_uri, as written here; JSON list); empty = none.",
    )
    teacher_servers: dict[str, str | None] = Field(
        default_factory=dict,
        description="Inference servers jobs' teachers may call, each bound to its key: a "
        "JSON map of the OpenAI-compatible base URL (teacher.server.url, as written here) "
        "to the name of the worker's environment variable holding its key, sent as a bearer "
        "token (null = none), or to `self` for this service's own /v1 (the worker calls it "
        "with a short-lived token of the job's team, no key); a JSON list of URLs = servers "
        "without a key; empty = none.",
    )
    teacher_replicas: dict[str, list[str]] = Field(
        default_factory=dict,
        description="A teacher tier: a JSON map of a teacher server's URL, as "
        "OPD_TEACHER_SERVERS lists it (and specs write it), to the base URLs of several "
        "servers of the same model behind it, which share its key. Each request goes to the "
        "least busy replica; one that fails rests 30 s while the others take its requests "
        "(the job's events say so). A URL left out is one server.",
    )
    vllm_servers: dict[str, str] = Field(
        default_factory=dict,
        description="vLLM servers (`opd vllm serve` prints the line): a JSON map of a base "
        "model, as a spec names it, to the OpenAI-compatible base URL of the server that "
        "serves it with runtime LoRA loading on (http://host:port/v1); empty = none.",
    )
    vllm_replicas: dict[str, list[str]] = Field(
        default_factory=dict,
        description="More vLLM servers of a base model OPD_VLLM_SERVERS names: a JSON map of "
        "the base model to their base URLs (each serving it as that one does, LoRA on, with "
        "the same --max-lora-rank and the worker's artifact folder readable). Each job "
        "samples on the server of the model with the fewest of its worker's jobs.",
    )
    vllm_max_lora_ranks: dict[str, int] = Field(
        default_factory=dict,
        description="The --max-lora-rank of each vLLM server (`opd vllm serve` prints the "
        "line): a JSON map of a base model, as OPD_VLLM_SERVERS names it, to the largest "
        "adapter rank its server loads; a job that samples there with a larger lora_rank is "
        "refused at submission, naming the limit. A model left out: no check there (the "
        "server refuses the adapter when the job loads it).",
    )
    webhook_allow_private: bool = Field(
        False, description="Let webhooks reach loopback, link-local and private addresses."
    )
    webhook_timeout: float = Field(10.0, gt=0, le=300, description="Seconds one delivery may take.")
    webhook_backoff_seconds: float = Field(
        5.0, gt=0, description="Wait before the first retry; doubled after each failure."
    )
    webhook_backoff_max_seconds: float = Field(
        3600.0, gt=0, description="The longest wait between two retries."
    )
    webhook_poll_interval: float = Field(
        1.0, gt=0, description="Seconds between a worker's looks for deliveries to send."
    )
    webhook_concurrency: int = Field(
        20, ge=1, le=500, description="Deliveries one worker process sends at once."
    )
    webhook_team_concurrency: int = Field(
        4,
        ge=1,
        le=500,
        description="Deliveries of one team a worker process sends at once (so one team's "
        "slow receivers cannot hold every place).",
    )

    @field_validator("teacher_servers", mode="before")
    @classmethod
    def _servers_bound_to_keys(cls, value: Any) -> Any:
        """A plain list of URLs (the old form) is servers without a key; each bound name
        must be an environment variable's, or SELF_SERVER."""
        if isinstance(value, list):
            value = dict.fromkeys(value)
        if isinstance(value, dict):
            for url, name in value.items():
                if name in (None, SELF_SERVER):
                    continue
                if not (isinstance(name, str) and ENV_VARIABLE.match(name)):
                    raise ValueError(
                        f"{url}: bind a server to the name of the worker's environment variable "
                        f"holding its key, {SELF_SERVER!r} or null, not {name!r}"
                    )
        return value

    @field_validator("vllm_servers")
    @classmethod
    def _vllm_urls(cls, value: dict[str, str]) -> dict[str, str]:
        """Each server by its http(s) URL, without the trailing slash the paths add."""
        for model, url in value.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{model}: give the server's http:// or https:// URL, not {url!r}")
        return {model: url.rstrip("/") for model, url in value.items()}

    @model_validator(mode="after")
    def _replicas_of_listed_servers(self) -> Settings:
        """Replicas stand behind a listed teacher server, each by its http(s) URL."""
        listed = {url.rstrip("/") for url in self.teacher_servers}
        for url, replicas in self.teacher_replicas.items():
            if url.rstrip("/") not in listed:
                raise ValueError(f"OPD_TEACHER_REPLICAS: {url} is not in OPD_TEACHER_SERVERS")
            if not replicas or not all(r.startswith(("http://", "https://")) for r in replicas):
                raise ValueError(f"OPD_TEACHER_REPLICAS: give {url} http(s) URLs of replicas")
        return self

    @model_validator(mode="after")
    def _vllm_replicas_of_named_models(self) -> Settings:
        for model, replicas in self.vllm_replicas.items():
            if model not in self.vllm_servers:
                raise ValueError(f"OPD_VLLM_REPLICAS: {model} is not in OPD_VLLM_SERVERS")
            if not all(url.startswith(("http://", "https://")) for url in replicas):
                raise ValueError(f"OPD_VLLM_REPLICAS: give {model} http(s) URLs of replicas")
        return self

    def vllm_tiers(self) -> dict[str, list[str]]:
        """Each base model's vLLM servers: OPD_VLLM_SERVERS' first, then its replicas."""
        return {
            model: [url, *(r.rstrip("/") for r in self.vllm_replicas.get(model, []))]
            for model, url in self.vllm_servers.items()
        }

    def replicas_of(self, url: str) -> list[str]:
        """The replicas behind teacher server `url` (OPD_TEACHER_REPLICAS); none: it alone."""
        tiers = {listed.rstrip("/"): replicas for listed, replicas in self.teacher_replicas.items()}
        return tiers.get(url.rstrip("/"), [])

    def teacher_server_binding(self, url: str) -> str | None:
        """What the operator bound server `url` to: a variable's name or SELF_SERVER."""
        bound = {listed.rstrip("/"): name for listed, name in self.teacher_servers.items()}
        return bound.get(url.rstrip("/"))

    def teacher_server_key_env(self, url: str) -> str | None:
        """The worker's variable holding the key the operator bound to server `url`."""
        name = self.teacher_server_binding(url)
        return None if name == SELF_SERVER else name

    def serves_itself(self, url: str) -> bool:
        """Whether server `url` is this service's own /v1 (bound to SELF_SERVER)."""
        return self.teacher_server_binding(url) == SELF_SERVER

    @field_validator("secret_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        keys = split_keys(value)
        for key in keys:
            try:
                Fernet(key)
            except ValueError:
                raise ValueError(
                    "each key must be 32 url-safe base64-encoded bytes; make one with: "
                    "python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())'"
                ) from None
        if not keys:
            raise ValueError("give at least one key, or leave it unset")
        return value

    @model_validator(mode="before")
    @classmethod
    def _default_to_home(cls, data: Any) -> Any:
        """Home becomes absolute (every process agrees whatever its working directory);
        unset or empty locations fall under it."""
        if not isinstance(data, dict):
            return data
        home = Path(data.get("home") or DEFAULT_HOME).expanduser().resolve()
        derived = {
            key: where.format(home=home) for key, where in UNDER_HOME.items() if not data.get(key)
        }
        return {**data, **derived, "home": home, "redis_url": data.get("redis_url") or None}


def split_keys(value: SecretStr) -> list[str]:
    """OPD_SECRET_KEY's keys in order (the first encrypts)."""
    return [key.strip() for key in value.get_secret_value().split(",") if key.strip()]


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()

"""Training backends behind one contract (`contract.py`), each used through `resilient`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernel.errors import OPDError
from kernel.retry import Backoff
from kernel.spec import JobSpec
from kernel.spec.backends import RemoteBackendSpec
from kernel.spec.base import MAX_RETRY_DELAY_SECONDS
from kernel.storage.checkpoints import CheckpointStore
from worker.engine.backends.contract import LogitServiceClient, SamplingClient, ServiceClient
from worker.engine.backends.resilient import Resilient, Warn, resilient

EXTRAS = {
    "tinker": ("tinker", {"tinker"}),
    "local": ("local", {"torch", "transformers", "peft", "safetensors"}),
}
"""backend: (the package extra it needs, the top-level modules that extra installs)."""


@contextmanager
def extra_installed(backend: str) -> Iterator[None]:
    """A backend whose extra is missing is an error that says what to install, not a
    bare "No module named ..." (other missing modules stay the bugs they are)."""
    try:
        yield
    except ModuleNotFoundError as error:
        extra, modules = EXTRAS[backend]
        if (error.name or "").split(".")[0] not in modules:
            raise
        raise OPDError(
            f"backend: {backend} needs the {extra!r} extra, which this worker lacks "
            f"({error}): install it with pip install 'opd-service[{extra}]'",
            code="backend_not_installed",
        ) from error


def connect(
    spec: JobSpec,
    artifact_dir: Path,
    warn: Warn,
    store: CheckpointStore | None = None,
    model_cache: Path | None = None,
    note: Warn | None = None,
) -> ServiceClient:
    """The service client for the spec's backend; heavy imports happen only here. Remote
    calls are retried as `resilient.py` says (`warn` hears of each retry); every backend's
    errors become the service's codes the same way. With a bucket (`store`), the local
    backend's checkpoints go through it (`stored.py`); remote backends keep their own. The
    local backend converts GGUF files into `model_cache` (default: the user's cache folder),
    and `note` hears of each conversion."""
    from worker.engine.backends.trio import ERRORS as PYTRIO_ERRORS

    if spec.backend == "trio":
        from worker.engine.backends.trio import connect_trio

        return resilient(connect_trio(spec.trio), PYTRIO_ERRORS, warn, call_backoff(spec.trio))
    if spec.backend == "tinker":
        with extra_installed("tinker"):
            from worker.engine.backends.tinker import ERRORS as TINKER_ERRORS
            from worker.engine.backends.tinker import connect_tinker

        service = connect_tinker(spec.tinker)
        backoff = call_backoff(spec.tinker)
        return resilient(service, TINKER_ERRORS, warn, backoff, contract=LogitServiceClient)
    with extra_installed("local"):
        from worker.engine.backends.local import LocalServiceClient
        from worker.engine.backends.local.gguf import quiet

    # The local backend raises PyTRIO's error types, and has nothing worth retrying.
    local = LocalServiceClient(spec.local, artifact_dir, model_cache, note or quiet)
    service = resilient(local, PYTRIO_ERRORS, warn, contract=LogitServiceClient)
    if store is None:
        return service
    from worker.engine.backends.stored import StoredService

    return StoredService(service, store)


def call_backoff(options: RemoteBackendSpec) -> Backoff:
    """How often, and how far apart, a remote backend's failing calls are tried."""
    return Backoff(
        initial=options.call_retry_delay_seconds,
        cap=MAX_RETRY_DELAY_SECONDS,
        attempts=options.call_attempts,
    )


def footprint(client: SamplingClient) -> int:
    """Bytes a sampling client holds in this process: a local model's tensors; a remote
    backend's client holds next to nothing (its weights stay on the service)."""
    inner = client.inner if isinstance(client, Resilient) else client
    return int(getattr(inner, "memory_bytes", 0))

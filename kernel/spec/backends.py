"""Each backend's own options: the local engine's device, dtype and threads; the remote
engines' timeouts and retries.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kernel.spec.base import MAX_RETRY_DELAY_SECONDS, SpecModel


class LocalBackendSpec(SpecModel):
    """Options of the in-process PyTorch backend."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto = CUDA when the worker has a GPU, else the CPU."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto = bfloat16 on CUDA, float32 on CPU."
    )
    cpu_threads: int = Field(
        1,
        ge=1,
        le=1024,
        description="Torch threads on the CPU. 1 keeps runs bit-for-bit reproducible (a job "
        "resumed after a crash replays exactly); more is faster for large models on a CPU.",
    )


class RemoteBackendSpec(SpecModel):
    """What every remote backend's group holds: the worker's retries of whole calls that
    still fail transiently after the SDK's own retries."""

    call_attempts: int = Field(
        4,
        ge=1,
        le=20,
        description="Tries of a backend call that keeps failing transiently (timeouts, "
        "429, 5xx, dropped connections) after the SDK's own retries; 1 = no retry.",
    )
    call_retry_delay_seconds: float = Field(
        5.0,
        gt=0.0,
        le=MAX_RETRY_DELAY_SECONDS,
        description="Wait before the first call retry; it doubles each time (at most "
        f"{MAX_RETRY_DELAY_SECONDS:.0f} s), scaled by a random 50-100%.",
    )


class TrioBackendSpec(RemoteBackendSpec):
    """Timeouts and retries handed to pytrio.configure before the first client is made."""

    request_timeout_seconds: int = Field(
        600, ge=1, le=86_400, description="PyTRIO's limit on one training or scoring request."
    )
    sampling_timeout_seconds: int = Field(
        600, ge=1, le=86_400, description="PyTRIO's limit on one sampling request."
    )
    retry_max_attempts: int = Field(
        5, ge=1, le=100, description="PyTRIO's tries of one HTTP request."
    )


class TinkerBackendSpec(RemoteBackendSpec):
    """Tinker's SDK retries timeouts, 429 and 5xx itself and has no option for how often;
    what still fails is retried as a whole by the worker (`call_attempts`)."""

    call_timeout_seconds: int = Field(
        3600,
        ge=1,
        le=86_400,
        description="Longest wait for one call's result, time queued at Tinker included; a "
        "call still unanswered then fails as transient.",
    )

"""What a shared service refuses of a valid spec: an MLflow server or a teacher server the
operator did not list (a spec must not make the service call an address it names), a vLLM
sampling engine no named server serves, and a
model name its backend cannot load.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from kernel.model_names import model_name_refusal
from kernel.spec.job import JobSpec


def unlisted_tracker(spec: JobSpec, allowed: Sequence[str]) -> str | None:
    """Why a shared service may not mirror `spec` to its MLflow server (one the operator did
    not list: a spec must not make the service call any address it names), or None."""
    tracker = spec.trackers.mlflow
    if tracker is None or tracker.tracking_uri.rstrip("/") in {u.rstrip("/") for u in allowed}:
        return None
    listed = ", ".join(allowed) if allowed else "none are"
    return (
        f"{tracker.tracking_uri} is not one of the MLflow servers this service may send to "
        f"({listed}; the operator lists them in OPD_MLFLOW_TRACKING_URIS)"
    )


def unlisted_teacher_server(spec: JobSpec, allowed: Collection[str]) -> tuple[str, str] | None:
    """(field, why) for the first teacher server of `spec` that the operator did not list
    (a spec must not make the worker call any address it names), or None. `allowed`: the
    listed URLs (OPD_TEACHER_SERVERS, a map of URL to key variable, iterates over them)."""
    listed = {url.rstrip("/") for url in allowed}
    for name, teacher in spec.teacher_specs().items():
        if teacher.server is None or teacher.server.url in listed:
            continue
        servers = ", ".join(allowed) if allowed else "none are"
        return (
            f"{spec.teacher_field(name)}.server.url",
            f"{teacher.server.url} is not one of the teacher servers this service may call "
            f"({servers}; the operator lists them in OPD_TEACHER_SERVERS)",
        )
    return None


def unserved_vllm_student(spec: JobSpec, servers: Mapping[str, str]) -> str | None:
    """Why `sampling.engine: vllm` cannot run, when no server the operator named
    (OPD_VLLM_SERVERS, base model -> URL) serves the student's base model; else None."""
    base = spec.student.base_model
    if spec.sampling.engine != "vllm" or base in servers:
        return None
    named = ", ".join(sorted(servers)) or "none"
    return (
        f"no vLLM server serves {base!r} (servers are named for: {named}): the operator "
        "names one in OPD_VLLM_SERVERS (opd vllm serve prints the line), or use engine: local"
    )


def vllm_rank_refusal(spec: JobSpec, max_ranks: Mapping[str, int]) -> str | None:
    """Why `sampling.engine: vllm` cannot load the student's adapter, when its rank is
    above the --max-lora-rank the operator gave its server (OPD_VLLM_MAX_LORA_RANKS);
    else None."""
    base, rank = spec.student.base_model, spec.student.lora_rank
    limit = max_ranks.get(base)
    if spec.sampling.engine != "vllm" or limit is None or rank <= limit:
        return None
    return (
        f"{rank} is above the largest adapter rank the vLLM server for {base!r} loads "
        f"(--max-lora-rank {limit}, OPD_VLLM_MAX_LORA_RANKS): use lora_rank {limit} or less, "
        "engine: local, or ask the operator for a server of a larger rank (vLLM pads every "
        "adapter to its server's rank, so a server serves small ranks faster)"
    )


def model_name_refusals(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, why) for each model name of the spec that its backend cannot load."""
    named = [("student.base_model", spec.student.base_model)]
    for teacher, teacher_spec in spec.teacher_specs().items():
        field = spec.teacher_field(teacher)
        server = teacher_spec.server
        if server is None:
            named.append((f"{field}.base_model", teacher_spec.base_model))
        elif server.tokenizer is not None:  # the server's model is its own to name
            named.append((f"{field}.server.tokenizer", server.tokenizer))
    return [
        (field, refusal)
        for field, name in named
        if (refusal := model_name_refusal(spec.backend, name)) is not None
    ]

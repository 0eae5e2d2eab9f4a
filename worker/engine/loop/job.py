"""A job from its spec: load its prompts, open its backend and grader, run the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from kernel.spec import JobSpec, StoredCompletionsDataset
from kernel.storage.cache import BlobCache
from kernel.storage.checkpoints import CheckpointStore
from worker.engine.backends.server import ServerKey
from worker.engine.data.prompts import Prompts
from worker.engine.loop.run import info_to, warning_to
from worker.engine.loop.state import RunResult, SavedState, Stop
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink


async def run_job(
    spec: JobSpec,
    sink: Sink,
    *,
    artifact_dir: Path,
    data_root: Path,
    confine_data: bool = False,
    blobs: BlobCache | None = None,
    checkpoints: CheckpointStore | None = None,
    resume: SavedState | None = None,
    should_stop: Callable[[], Stop | None] = lambda: None,
    model_cache: Path | None = None,
    server_keys: Mapping[str, ServerKey] | None = None,
    server_replicas: Mapping[str, Sequence[str]] | None = None,
    vllm_servers: Mapping[str, Sequence[str]] | None = None,
) -> RunResult:
    """Load the prompts, open the backend (its checkpoints in `checkpoints`, a bucket, if
    given; GGUF models converted into `model_cache`) and run the loop; the sink is always
    closed."""
    from worker.engine.backends import connect
    from worker.engine.data.datasets import load_datasets
    from worker.engine.eval.prompts import graded_prompts, load_eval_prompts, open_grader

    try:
        prompts = await asyncio.to_thread(load_datasets, spec, data_root, confine_data, blobs)
        for share in spec.dataset_shares():
            pool = prompts[share.name]
            several = f" (dataset {share.name})" if spec.several_datasets() else ""
            found, counted = {}, ""
            if isinstance(share, StoredCompletionsDataset):
                found = {"found": len(share.rows or []), "left_out": pool.left_out}
                counted = (
                    f": the filter found {found['found']} stored completions, "
                    f"{pool.left_out} without feedback left out"
                )
            sink.event(
                "info",
                f"Loaded {len(pool)} prompts from {share.source}{several}{counted}",
                {"prompts": len(pool)} | ({"dataset": share.name} if several else {}) | found,
            )
        eval_prompts: dict[str, Prompts] = {}
        if spec.eval is not None:
            eval_prompts = await asyncio.to_thread(
                load_eval_prompts, spec, data_root, confine_data, blobs
            )
        service = await asyncio.to_thread(
            connect, spec, artifact_dir, warning_to(sink), checkpoints, model_cache, info_to(sink)
        )
        async with AsyncExitStack() as stack:
            graded = graded_prompts(spec, prompts, eval_prompts)
            grade = await stack.enter_async_context(open_grader(graded))
            return await run_loop(
                spec,
                service,
                prompts,
                sink,
                resume=resume,
                should_stop=should_stop,
                eval_prompts=eval_prompts if spec.eval is not None else None,
                grade=grade,
                server_keys=server_keys,
                server_replicas=server_replicas,
                vllm_servers=vllm_servers,
                job_folder=artifact_dir,
            )
    finally:
        sink.close()

"""A fake of PyTRIO's REST client (`ServiceClient.create_rest_client()`), for the fake
service in `trio.py`: it lists the checkpoints that service saved and downloads an archive
of each. Every answer is built as PyTRIO's Control protocol response (so the protocol's own
checks run) and converted with PyTRIO's own adapters into the SDK's types, as the real
client converts what Control sends.

An archive is a .tar.gz of `checkpoint.json`: what the fake saved under that path (base
model, LoRA rank, optimizer steps, weights), the same bytes every time.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pytrio.client.adapters.rest.checkpoint import (
    archive_url_from_download,
    checkpoints_from_control,
)
from pytrio.errors.base import ValidationError
from pytrio.errors.control import ControlAPIError
from pytrio.protocol.control.checkpoint.download import CheckpointDownloadResponse
from pytrio.protocol.control.checkpoint.list import CheckpointListResponse, CheckpointResponse
from pytrio.protocol.control.common import ControlCursor
from pytrio.types.rest import (
    CheckpointArchiveUrlResponse,
    CheckpointDownloadResult,
    CheckpointsListResponse,
)

from tests.fakes import model

if TYPE_CHECKING:
    from tests.fakes.trio import FakeServiceClient

ARCHIVE_HOST = "https://archives.fake.pytrio"
CONTROL_TYPES = {"state": "TRAINING", "weights": "SAMPLER"}


def id_of(path: str) -> str:
    return f"ckpt-{model.digest('checkpoint', path)}"


class FakeRestClient:
    def __init__(self, service: FakeServiceClient) -> None:
        self.service = service

    def listing(self) -> list[CheckpointResponse]:
        """Every saved checkpoint as Control lists it, oldest first."""
        rows = []
        for path, saved in self.service.checkpoints.items():
            run, kind, name = path.removeprefix("trio://fake/").split("/")
            rows.append(
                CheckpointResponse(
                    cuid=id_of(path),
                    checkpoint_cuid=id_of(path),
                    training_run_cuid=run,
                    name=name,
                    checkpoint_type=CONTROL_TYPES[kind],
                    status="READY",
                    checkpoint_uri=path,
                    model=saved.base_model,
                    base_model=saved.base_model,
                    model_spec_cuid=f"spec-{saved.base_model}",
                    task_id=f"task-{run}",
                    task_created_at=saved.created_at,
                    task_status="RUNNING",
                    step=saved.optimizer_steps,
                    path=path,
                    created_at=saved.created_at,
                    size_bytes=len(self.archive(path)),
                    lora_rank=saved.rank,
                    is_uploaded=True,
                )
            )
        return rows

    async def list_user_checkpoints_async(
        self, limit: int = 100, offset: int = 0
    ) -> CheckpointsListResponse:
        rows = self.listing()
        page = CheckpointListResponse(
            checkpoints=rows[offset : offset + limit],
            cursor=ControlCursor(offset=offset, limit=limit, total=len(rows)),
        )
        self.service.record("list_user_checkpoints", limit=limit, offset=offset)
        return checkpoints_from_control(page)

    def path_of(self, checkpoint_id: str) -> str:
        if not checkpoint_id:
            raise ValidationError(
                f"Expected a non-empty value for `checkpoint_id` but received {checkpoint_id!r}",
                code="validation.empty_rest_argument",
            )
        for path in self.service.checkpoints:
            if id_of(path) == checkpoint_id:
                return path
        raise ControlAPIError(
            f"checkpoint {checkpoint_id} not found", status_code=404, code="not_found"
        )

    def source(self, checkpoint_id: str) -> CheckpointDownloadResponse:
        self.path_of(checkpoint_id)
        return CheckpointDownloadResponse(
            url=f"{ARCHIVE_HOST}/{checkpoint_id}.tar.gz",
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            source="object_storage",
            checkpoint_status="READY",
            tls_cert_pem=None,
            tls_not_after=None,
        )

    async def get_checkpoint_archive_url_async(
        self, checkpoint_id: str
    ) -> CheckpointArchiveUrlResponse:
        return archive_url_from_download(self.source(checkpoint_id))

    async def download_checkpoint_async(
        self, checkpoint_id: str, destination_path: str | Path, *, resume: bool = True
    ) -> CheckpointDownloadResult:
        self.source(checkpoint_id)
        data = self.archive(self.path_of(checkpoint_id))
        Path(destination_path).write_bytes(data)
        self.service.record("download_checkpoint", checkpoint_id=checkpoint_id, resume=resume)
        return CheckpointDownloadResult(
            checkpoint_id=checkpoint_id,
            path=str(destination_path),
            bytes_written=len(data),
            file_size_bytes=len(data),
            status_code=200,
            resumed=False,
        )

    def archive(self, path: str) -> bytes:
        """The .tar.gz of what was saved at `path`: the same bytes on every call."""
        saved = self.service.checkpoints[path]
        content = json.dumps(
            {
                "path": path,
                "base_model": saved.base_model,
                "lora_rank": saved.rank,
                "optimizer_steps": saved.optimizer_steps,
                "weights": saved.weights,
            },
            sort_keys=True,
        ).encode()
        buffer = io.BytesIO()
        with (
            gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w") as tar,
        ):
            entry = tarfile.TarInfo("checkpoint.json")
            entry.size = len(content)
            tar.addfile(entry, io.BytesIO(content))
        return buffer.getvalue()

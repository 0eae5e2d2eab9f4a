"""Files: upload (streamed, with a progress bar), read, list, download, delete."""

from __future__ import annotations

from pathlib import Path

from app.files.schemas import FileDetail, FilePublic, FilesPage
from opd.sdk.progress import UploadProgress
from opd.sdk.resources.base import Resource, X, idempotency, listed, operation, query
from opd.sdk.results import Download
from opd.sdk.transport import Call, Listing, Steps, fetch


class Files(Resource[X]):
    """`/v1/files`: datasets the team uploads, named in specs as `{source: file, file: id}`."""

    @operation
    def upload(
        self,
        path: str | Path,
        *,
        field: str | None = None,
        answer_field: str | None = None,
        format: str | None = None,
        model: str | None = None,
        progress: bool = True,
        idempotency_key: str | None = None,
    ) -> Steps[FileDetail]:
        """Upload a JSONL, Parquet or CSV file (a table of questions, or conversations in
        OpenAI's or TRL's chat formats: `model` names the model whose tokens the report
        counts the longest one in), streamed from disk (a progress bar on stderr unless
        `progress` is False); the answer is its report. Sent again on a lost answer,
        with the same `Idempotency-Key` (one of its own unless you give one): the API
        answers a repeat with the file the first made, and refuses the key with another file
        (422 `idempotency_key_reused`)."""
        path = Path(path)
        bar = UploadProgress(path.name, path.stat().st_size) if progress else None
        params = query(
            filename=path.name, field=field, answer_field=answer_field, format=format, model=model
        )
        call = Call(
            "POST",
            "/v1/files",
            params=params,
            headers=idempotency(idempotency_key),
            upload=path,
            sent=bar and bar.sent,
        )
        try:
            return (yield from fetch(call, FileDetail))
        finally:
            if bar is not None:
                bar.close()

    @listed(FilePublic)
    def list(self, *, page_size: int = 100) -> Listing:
        """The team's files, newest first."""
        return Listing(Call("GET", "/v1/files", params={"limit": page_size}), FilesPage)

    @operation
    def get(self, file_id: str) -> Steps[FileDetail]:
        """The file and its report (rows, columns, fields, empty and duplicate questions,
        a preview)."""
        return (yield from fetch(Call("GET", f"/v1/files/{file_id}"), FileDetail))

    @operation
    def download(self, file_id: str, to: str | Path) -> Steps[Download]:
        """The file's bytes as uploaded, written to `to`, their SHA-256 checked on the way."""
        path = Path(to)
        reply = yield Call("GET", f"/v1/files/{file_id}/content", download=path)
        assert reply is not None and reply.sha256 is not None
        return Download(path, reply.sha256)

    @operation
    def delete(self, file_id: str) -> Steps[None]:
        """Delete it (refused while an unfinished job reads it)."""
        yield Call("DELETE", f"/v1/files/{file_id}")

"""Files: upload a dataset (the body is the file, or OpenAI's upload form holding it,
streamed to disk and checked, then put in the store), list them, read one with its report,
download its content, delete it."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse

from app.api.deps import PrincipalDep, SessionDep, SettingsDep, SpoolsDep, StorageDep
from app.api.errors import ApiError, error_responses
from app.core.pages import Order
from app.files.form import is_form, read_form
from app.files.names import MAX_FILENAME_CHARS, content_disposition
from app.files.schemas import (
    FILE_CURSOR_PATTERN,
    FILE_ID_PATTERN,
    MAX_PURPOSE_CHARS,
    FileDetail,
    FileFormat,
    FilesPage,
    form_schema,
    public_id,
    row_id,
)
from app.files.service import (
    MEDIA_TYPES,
    Upload,
    content,
    detail,
    download_url,
    public,
    upload_file,
)
from app.files.store import get_file, keep_purpose, list_files
from app.files.tables import UploadedFile
from app.jobs.uploads import remove_file
from kernel.storage.blobs import BlobMissing

router = APIRouter(prefix="/v1/files", tags=["files"], responses=error_responses(401, 422, 503))

MAX_PAGE = 100
PRESIGNED_SECONDS = 300
FileId = Annotated[str, Path(pattern=FILE_ID_PATTERN, description="The file's id, file-N.")]
Column = Annotated[str | None, Query(min_length=1, max_length=200)]
UploadKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Same key + same file and parameters = the same file (200); "
        "anything else sent with it = 422.",
    ),
]


def declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


@router.post(
    "",
    status_code=201,
    response_model=FileDetail,
    responses={200: {"model": FileDetail, "description": "The team had these bytes."}}
    | error_responses(400, 403, 413, 429),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "multipart/form-data": {"schema": form_schema()},
            },
        }
    },
)
async def upload(
    request: Request,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    storage: StorageDep,
    spools: SpoolsDep,
    filename: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_FILENAME_CHARS,
            description="e.g. train.jsonl; any characters but control characters. Needed "
            "with a raw body; a form's file part names its file (this, if given, instead).",
        ),
    ] = None,
    format: Annotated[FileFormat | None, Query(description="Default: from the name.")] = None,
    field: Column = None,
    answer_field: Column = None,
    model: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=500,
            description="A file of conversations: the model whose tokens the report counts the "
            "longest one in (the byte-level presets; null for others).",
        ),
    ] = None,
    idempotency_key: UploadKey = None,
) -> FileDetail:
    """Upload a JSONL, Parquet or CSV file as the request body (`curl -T data.jsonl`), or as
    OpenAI's upload form (`multipart/form-data`: `file`, `purpose`, and `format`, `field`,
    `answer_field` before the file or as query parameters; what `client.files.create`
    sends; its `purpose` is kept, `fine-tune` when none is sent), up to
    OPD_MAX_UPLOAD_BYTES and within the team's OPD_TEAM_MAX_FILE_BYTES. It must parse and
    hold a text column of questions (`field`, else guessed: question, prompt, problem, ...)
    with at least one non-empty question; `answer_field` (else guessed: answer,
    final_answer, solution, ...) names the reference answers. Or it holds conversations,
    told by its first row's shape (OpenAI's fine-tuning format and TRL's `messages`; TRL's
    `prompt` and `completion` as lists of messages): every row is checked as OpenAI's
    fine-tuning validator checks a line, and a file with problems is a 422
    (`invalid_chat_file`) listing the first ones, each with its line; the report's `chat`
    counts its conversations, turns, roles and tool calls. A file refused (422, 413)
    leaves nothing behind. The same bytes again, with the same fields, answer 200 with the
    file they made; so does a retry with the same `Idempotency-Key`. Past the bytes of
    uploads one team (OPD_TEAM_MAX_SPOOL_BYTES) or all (OPD_MAX_SPOOL_BYTES) may have
    arriving at once in an API process: 429 with Retry-After. A form that does not parse
    is a 400, one with another field, or without its file, a 422 (`invalid_form`)."""
    asked = Upload(filename or "", format, field, answer_field, None, idempotency_key, model)
    content_type = request.headers.get("content-type")
    form = await read_form(content_type, request.stream()) if is_form(content_type) else None
    if form is not None:
        upload_, chunks = form.upload(asked), form.chunks()
    else:
        upload_, chunks = raw_upload(asked, request), request.stream()
    row, created = await upload_file(session, principal, storage, settings, upload_, chunks, spools)
    if not created:
        response.status_code = 200
    elif form is not None:
        row = await keep_purpose(session, row, form.purpose())
    return detail(row)


def raw_upload(asked: Upload, request: Request) -> Upload:
    """The upload a raw body makes: the query names it, Content-Length may declare it."""
    if not asked.filename:
        raise ApiError(
            422,
            "invalid_request",
            "filename: this field is required with a raw body (a form's file part names its file)",
            "filename",
        )
    return replace(asked, declared_bytes=declared_length(request))


@router.get("", response_model=FilesPage)
async def get_files(
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[
        str | None,
        Query(
            pattern=FILE_CURSOR_PATTERN,
            description="List the files after this one: a page's `last_id` (or the old "
            "`next_cursor`).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    order: Annotated[Order, Query(description="By creation time: `desc` newest first.")] = (
        Order.desc
    ),
    purpose: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_PURPOSE_CHARS, description="Only this purpose's."),
    ] = None,
) -> FilesPage:
    """The team's files (every team's for an admin key), newest first, in OpenAI's list
    shape: while `has_more`, pass `last_id` as `after` (what the `openai` package's
    `client.files.list()` does as it pages)."""
    start = None if after is None else row_id(after)
    rows = await list_files(
        session, principal.scope, start, limit, oldest_first=order is Order.asc, purpose=purpose
    )
    page = FilesPage.of([public(row) for row in rows], limit, lambda file: file.id)
    if page.has_more:
        page.next_cursor = row_id(page.data[-1].id)
    return page


@router.get("/{file_id}", response_model=FileDetail, responses=error_responses(404))
async def get_file_detail(
    file_id: FileId, session: SessionDep, principal: PrincipalDep
) -> FileDetail:
    """The file and its report: rows, columns, the question and answer fields, empty and
    duplicate questions, a preview of its first rows."""
    return detail(await get_file(session, row_id(file_id), principal.scope))


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        307: {
            "description": "`redirect=true` on an S3 store where the operator allows it "
            "(OPD_PRESIGNED_DOWNLOADS): the presigned URL."
        },
    }
    | error_responses(404, 410),
)
async def get_file_content(
    file_id: FileId,
    session: SessionDep,
    principal: PrincipalDep,
    storage: StorageDep,
    settings: SettingsDep,
    redirect: Annotated[
        bool,
        Query(
            description="On a bucket whose operator allows it: answer 307 to a presigned URL "
            "of the object instead (elsewhere the bytes, as without it)."
        ),
    ] = False,
) -> Response:
    """The file's bytes as uploaded, streamed from the store and checked against their
    sha256 as they go (a damaged object ends the response early rather than pass); a 410
    when the store no longer has them, said before any byte. With `redirect=true`, on an
    S3 store with OPD_PRESIGNED_DOWNLOADS on, a 307 to a presigned URL valid for 5 minutes
    (check the bytes against the `ETag`'s sha256 yourself)."""
    row = await get_file(session, row_id(file_id), principal.scope)
    await session.commit()  # no connection held while the bytes stream
    try:
        if redirect and settings.presigned_downloads:
            signed = await download_url(storage, row, PRESIGNED_SECONDS)
            if signed is not None:
                return RedirectResponse(
                    signed, status_code=307, headers={"ETag": f'"{row.sha256}"'}
                )
        body = await content(storage, row)
    except BlobMissing:
        raise content_missing(row) from None
    headers = {
        "Content-Length": str(row.bytes),
        "Content-Disposition": content_disposition(row.filename),
        "ETag": f'"{row.sha256}"',
    }
    return StreamingResponse(body, media_type=MEDIA_TYPES[FileFormat(row.format)], headers=headers)


def content_missing(row: UploadedFile) -> ApiError:
    return ApiError(
        410,
        "content_missing",
        f"{public_id(row.id or 0)}'s bytes are no longer in the store; upload the file again",
    )


@router.delete("/{file_id}", status_code=204, responses=error_responses(404, 409))
async def delete(
    file_id: FileId, session: SessionDep, principal: PrincipalDep, storage: StorageDep
) -> Response:
    """Delete the file (a 409 while an unfinished job of the team reads it); its bytes
    leave the store once no file has them."""
    await remove_file(session, principal, storage, row_id(file_id))
    return Response(status_code=204)

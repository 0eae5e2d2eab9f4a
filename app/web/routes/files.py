"""Uploaded files on the dashboard: the list with an upload form, a file's report and
preview, delete. The upload is the API's use case (app/files/service.py), its body the file
itself, sent by the page's script (dashboard.js) with the form's CSRF token in a header,
so a large file streams as it does to POST /v1/files."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from app.api.deps import SessionDep, SettingsDep, SpoolsDep, StorageDep
from app.api.routes.files import declared_length
from app.auth.sessions import NONCE_COOKIE
from app.files.errors import FileRefused
from app.files.schemas import FILE_ID_PATTERN, row_id
from app.files.service import Upload, detail, public, upload_file
from app.files.store import get_file as read_file
from app.files.store import list_files
from app.jobs.uploads import remove_file
from app.web.deps import CSRF_CHECKED, ActingViewerDep, ViewerDep
from app.web.errors import WebError
from app.web.security import session_token, signer
from app.web.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)

LISTED = 100
CSRF_HEADER = "X-CSRF-Token"
FileId = Annotated[str, Path(pattern=FILE_ID_PATTERN)]
Column = Annotated[str | None, Query(min_length=1, max_length=200)]


@router.get("/files")
async def files_page(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    """The team's files (every team's for an admin), newest first, and an upload form."""
    rows = await list_files(session, viewer.scope, None, LISTED)
    context = {"viewer": viewer, "files": [public(row) for row in rows[:LISTED]]}
    return render(request, "files.html", context)


@router.get("/files/{file_id}")
async def file_page(
    request: Request, file_id: FileId, session: SessionDep, viewer: ViewerDep
) -> Response:
    """A file's report: its columns, fields, empty and duplicate questions, a preview."""
    file = detail(await read_file(session, row_id(file_id), viewer.scope))
    return render(request, "file.html", {"viewer": viewer, "file": file})


@router.post("/files/upload")
async def upload(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    storage: StorageDep,
    spools: SpoolsDep,
    viewer: ActingViewerDep,
    filename: Annotated[str, Query(min_length=1, max_length=255)],
    field: Column = None,
    answer_field: Column = None,
) -> JSONResponse:
    """The page's script sends the file as the body; the answer (JSON) says where its
    report is, or why it was refused. Needs a key with the `submit` scope; audited."""
    nonce = request.cookies.get(NONCE_COOKIE, "")
    token = request.headers.get(CSRF_HEADER, "")
    if not signer(request).csrf_valid(token, nonce, session_token(request)):
        raise WebError(
            403, "This form has expired or did not come from this site: reload the page."
        )
    fields = Upload(filename, None, field, answer_field, declared_length(request))
    try:
        row, _ = await upload_file(
            session, viewer, storage, settings, fields, request.stream(), spools
        )
    except FileRefused as refused:
        return JSONResponse({"error": refused.message}, status_code=refused.status)
    file = detail(row)
    return JSONResponse({"id": file.id, "url": f"/ui/files/{file.id}", "rows": file.rows})


@router.post("/files/{file_id}/delete", dependencies=CSRF_CHECKED)
async def delete(
    file_id: FileId, session: SessionDep, storage: StorageDep, viewer: ActingViewerDep
) -> Response:
    """Delete the file (refused while an unfinished job reads it); audited."""
    await remove_file(session, viewer, storage, row_id(file_id))
    return RedirectResponse("/ui/files", status_code=303)

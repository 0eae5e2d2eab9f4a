"""Sign in with an API key (the browser keeps only a session cookie) and sign out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from app.api.deps import SessionDep
from app.auth.keys import authenticate, hash_key
from app.core.tables import utcnow
from app.web.deps import CSRF_CHECKED, FormDep
from app.web.security import end_session, start_session
from app.web.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)

HOME = "/ui/jobs"
MAX_KEY_CHARS = 200


def safe_next(path: str) -> str:
    """Where to go after signing in: a dashboard page of this site, never elsewhere."""
    if path.startswith("/ui/") and not path.startswith("//") and "\\" not in path:
        return path
    return HOME


@router.get("/sign-in")
async def sign_in_page(
    request: Request, next_path: Annotated[str, Query(alias="next", max_length=2000)] = HOME
) -> Response:
    return render(request, "sign_in.html", {"next": safe_next(next_path), "error": None})


@router.post("/sign-in")
async def sign_in(request: Request, session: SessionDep, form: FormDep) -> Response:
    """A good key starts a session and goes on to `next`; a bad one shows the form again."""
    key = form.get("key", "").strip()
    next_path = safe_next(form.get("next", HOME))
    principal = None
    if 0 < len(key) <= MAX_KEY_CHARS:
        principal = await authenticate(session, key, request.app.state.principals)
    if principal is None or principal.expired(utcnow()):
        error = "This API key has expired." if principal else "Unknown or revoked API key."
        context = {"next": next_path, "error": error}
        return render(request, "sign_in.html", context, status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    start_session(request, response, hash_key(key))
    return response


@router.post("/sign-out", dependencies=CSRF_CHECKED)
async def sign_out(request: Request) -> Response:
    response = RedirectResponse("/ui/sign-in", status_code=303)
    end_session(request, response)
    return response

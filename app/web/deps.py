"""What dashboard routes depend on: the signed-in viewer and CSRF-checked forms."""

from __future__ import annotations

import time
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, Request

from app.api.deps import SessionDep
from app.auth.keys import Principal
from app.auth.schemas import Scope
from app.auth.sessions import NONCE_COOKIE, session_principal
from app.web.errors import SignInRequired, WebError
from app.web.security import session_token, signer

FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FIELDS = 50


async def get_viewer(request: Request, session: SessionDep) -> Principal:
    """The principal the session cookie signs in; without one, off to the sign-in page."""
    principal = await session_principal(request, session, time.time())
    if principal is None:
        query = f"?{request.url.query}" if request.url.query else ""
        raise SignInRequired(request.url.path + query if request.method == "GET" else "/ui/jobs")
    return principal


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded body of a dashboard form, after its CSRF token checks out (else 403).
    Repeated fields keep their last value."""
    if request.headers.get("content-type", "").split(";")[0].strip() != FORM_TYPE:
        raise WebError(415, "Forms must be sent as application/x-www-form-urlencoded.")
    body = await request.body()
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError as error:
        raise WebError(400, "The form is not valid UTF-8.") from error
    except ValueError as error:
        raise WebError(400, f"A form has at most {MAX_FIELDS} fields.") from error
    if any("\x00" in name or "\x00" in value for name, value in pairs):
        raise WebError(400, "A form's fields cannot hold a NUL character.")
    fields = dict(pairs)
    nonce = request.cookies.get(NONCE_COOKIE, "")
    if not signer(request).csrf_valid(fields.get("csrf_token", ""), nonce, session_token(request)):
        raise WebError(
            403, "This form has expired or did not come from this site: reload the page."
        )
    return fields


async def get_acting_viewer(viewer: Annotated[Principal, Depends(get_viewer)]) -> Principal:
    """The viewer, if its key may act on jobs (the `submit` scope); else a 403 page."""
    if not viewer.allows(Scope.submit):
        raise WebError(
            403,
            f"This needs a key with the 'submit' scope; you signed in with a "
            f"{viewer.key_scope.value!r} key.",
        )
    return viewer


ViewerDep = Annotated[Principal, Depends(get_viewer)]
ActingViewerDep = Annotated[Principal, Depends(get_acting_viewer)]
FormDep = Annotated[dict[str, str], Depends(read_form)]
CSRF_CHECKED = [Depends(read_form)]
"""For a route whose form carries nothing but its CSRF token (`dependencies=CSRF_CHECKED`)."""

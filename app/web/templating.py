"""Jinja2 templates (every value escaped unless a template says otherwise, and none does)
and the one function that turns a template into a page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from app.web import present
from app.web.security import csrf_token, remember_nonce
from kernel.progress import duration

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
)
templates.env.filters.update(
    duration=duration,
    number=present.number,
    when=present.when,
)
templates.env.globals.update(status_class=present.status_class)


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """The page `name`, with the CSRF token its forms carry; sets the browser's nonce
    cookie on its first visit."""
    response = templates.TemplateResponse(
        request,
        name,
        {"csrf_token": csrf_token(request), **context},
        status_code=status_code,
        headers={"Cache-Control": "no-store"},
    )
    remember_nonce(request, response)
    return response

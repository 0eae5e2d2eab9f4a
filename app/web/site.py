"""Puts the dashboard into the API's app: its pages under /ui, its static files, its
error pages and security headers. Nothing here changes the JSON API."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from app.auth.sessions import SessionSigner, load_secret
from app.core.config import Settings
from app.web.errors import install_error_pages
from app.web.routes import (
    compare,
    completions,
    files,
    jobs,
    new_job,
    playground,
    session,
    sweeps,
    usage,
)
from app.web.security import SecurityHeadersMiddleware, is_dashboard_path
from app.web.templating import HERE

HOURS = 3600


def install_dashboard(app: FastAPI, settings: Settings) -> None:
    app.state.session_signer = SessionSigner(load_secret(settings), settings.session_hours * HOURS)
    for module in (session, playground, jobs, compare, new_job, sweeps, files, completions, usage):
        app.include_router(module.router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="static")
    for path in ("/", "/ui/"):
        app.add_api_route(path, to_dashboard, include_in_schema=False)
    app.add_middleware(SecurityHeadersMiddleware)
    install_error_pages(app, is_dashboard_path)


async def to_dashboard() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)

"""Fixtures for the dashboard: a browser-like HTTP client (it keeps cookies) signed in
with a team's key, and the CSRF token a page's forms carry."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import httpx
import pytest

from app.auth.keys import NewKey

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')

SignIn = Callable[[NewKey], Awaitable[httpx.Response]]
NAMED_YAML = (
    "backend: local\nstudent: {base_model: tiny-student}\nteacher: {base_model: tiny-teacher}\n"
)
"""What a spec must name (backend and models), to follow a test's own YAML."""


def csrf_of(page: httpx.Response) -> str:
    """The CSRF token in a page's forms."""
    match = CSRF.search(page.text)
    assert match, f"no CSRF token on {page.url}"
    return match.group(1)


async def post_form(
    client: httpx.AsyncClient, path: str, page: httpx.Response, **fields: str
) -> httpx.Response:
    """Submit a form of `page` (with its CSRF token) to `path`."""
    return await client.post(path, data={"csrf_token": csrf_of(page), **fields})


@pytest.fixture
def sign_in(client: httpx.AsyncClient) -> SignIn:
    async def sign(key: NewKey) -> httpx.Response:
        page = await client.get("/ui/sign-in")
        return await post_form(client, "/ui/sign-in", page, key=key.key, next="/ui/jobs")

    return sign

"""Dashboard session tokens: what they name, when they stop working, what a forger can't do."""

from __future__ import annotations

import threading
from pathlib import Path

from app.auth.sessions import SessionSigner, load_secret
from app.core.config import Settings

SIGNER = SessionSigner(b"s" * 32, lifetime=3600)


def test_a_token_names_its_key_until_it_expires():
    token = SIGNER.issue("hash-1", now=1000.0)
    assert SIGNER.read(token, now=1000.0) == "hash-1"
    assert SIGNER.read(token, now=4599.0) == "hash-1"
    assert SIGNER.read(token, now=4600.0) is None, "expired"


def test_a_tampered_or_foreign_token_is_refused():
    token = SIGNER.issue("hash-1", now=1000.0)
    payload, signature = token.split(".")
    forged_payload = SessionSigner(b"x" * 32, 3600).issue("hash-2", now=1000.0).split(".")[0]
    assert SIGNER.read(f"{forged_payload}.{signature}", now=1000.0) is None
    assert SessionSigner(b"o" * 32, 3600).read(token, now=1000.0) is None, "another secret"
    for junk in ("", ".", "abc", f"{payload}.", f"{payload}.{signature}x", "!!.??"):
        assert SIGNER.read(junk, now=1000.0) is None


def test_csrf_tokens_are_bound_to_the_browser_and_the_session():
    token = SIGNER.csrf_token("nonce-a", "session-1")
    assert SIGNER.csrf_valid(token, "nonce-a", "session-1")
    assert not SIGNER.csrf_valid(token, "nonce-b", "session-1")
    assert not SIGNER.csrf_valid(token, "nonce-a", "session-2")
    assert not SIGNER.csrf_valid(token, "", "session-1"), "no nonce cookie, no form"


def test_the_secret_is_made_once_and_shared_by_processes_of_one_home(tmp_path: Path):
    settings = Settings(home=tmp_path)
    secrets: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: secrets.append(load_secret(settings))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(secrets)) == 1 and len(secrets[0]) >= 32
    assert (tmp_path / "session-secret").stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob(".session-secret.*")), "no temporary file is left"
    configured = Settings(home=tmp_path, session_secret="c" * 40)
    assert load_secret(configured) == b"c" * 40

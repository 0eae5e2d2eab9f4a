"""Secrets at rest: encrypted under the first of OPD_SECRET_KEY's keys, readable under any
of them, and without the setting under a key the installation makes once in its home."""

from __future__ import annotations

import stat

import pytest
from cryptography.fernet import Fernet
from pydantic import ValidationError

from app.core.config import Settings
from app.core.encryption import KEY_FILE, SecretBox, SecretUnreadable, secret_box

SECRET = "whsec_c2VjcmV0"


def new_key() -> str:
    return Fernet.generate_key().decode()


def test_the_first_key_encrypts_and_every_key_decrypts(tmp_path):
    old, new = new_key(), new_key()
    sealed = secret_box(Settings(home=tmp_path, secret_key=old)).seal(SECRET)
    assert SECRET not in sealed

    rotated = secret_box(Settings(home=tmp_path, secret_key=f"{new}, {old}"))
    assert rotated.open(sealed) == SECRET, "the old key still decrypts"
    assert Fernet(new).decrypt(rotated.seal(SECRET).encode()).decode() == SECRET
    resealed = rotated.reseal(sealed)
    assert SecretBox([new]).open(resealed) == SECRET, "resealed: the old key can go"
    with pytest.raises(SecretUnreadable):
        SecretBox([new]).open(sealed)


def test_without_a_setting_the_key_is_made_once_in_home(tmp_path):
    sealed = secret_box(Settings(home=tmp_path)).seal(SECRET)
    kept = tmp_path / KEY_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert secret_box(Settings(home=tmp_path)).open(sealed) == SECRET, "the same key again"
    assert SecretBox([kept.read_text().strip()]).open(sealed) == SECRET


@pytest.mark.parametrize("value", ["not-a-key", "{good},short", " , "])
def test_a_bad_key_is_refused_when_settings_are_read(tmp_path, value):
    """(`{good}` is a fresh valid key, made in the test: a parameter drawn at collection
    would differ between the suite's xdist workers.)"""
    with pytest.raises(ValidationError, match="secret_key"):
        Settings(home=tmp_path, secret_key=value.format(good=new_key()))

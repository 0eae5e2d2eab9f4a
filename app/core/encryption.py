"""Secrets at rest (webhook signing secrets): stored as Fernet tokens, never as given.

The keys come from OPD_SECRET_KEY, a comma-separated list: the first encrypts, every one
decrypts, so a key is rotated by putting a new one first (rows written under the old one
stay readable until `reseal` rewrites them). Unset: one key, generated once into
<home>/secret-key like the session secret.
"""

from __future__ import annotations

from collections.abc import Callable

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from app.core.config import Settings, split_keys
from app.core.home_secrets import home_secret

KEY_FILE = "secret-key"


class SecretUnreadable(Exception):
    """A stored secret that none of the configured keys decrypts."""


class SecretBox:
    """Encrypts secrets under the first key, decrypts them under any."""

    def __init__(self, keys: list[str]) -> None:
        self.fernet = MultiFernet([Fernet(key) for key in keys])

    def seal(self, secret: str) -> str:
        return self.fernet.encrypt(secret.encode()).decode()

    def open(self, sealed: str) -> str:
        return self.unsealed(self.fernet.decrypt, sealed)

    def reseal(self, sealed: str) -> str:
        """The same secret encrypted under the first key (rotation)."""
        return self.unsealed(self.fernet.rotate, sealed)

    @staticmethod
    def unsealed(operation: Callable[[bytes], bytes], sealed: str) -> str:
        """What `operation` makes of a stored secret, which one of the keys must open."""
        try:
            return operation(sealed.encode()).decode()
        except InvalidToken:
            raise SecretUnreadable(
                "a stored secret was encrypted under a key OPD_SECRET_KEY does not list"
            ) from None


def secret_keys(settings: Settings) -> list[str]:
    """OPD_SECRET_KEY's keys, else the key kept in <home> (made on first use)."""
    if settings.secret_key is not None:
        return split_keys(settings.secret_key)
    return [home_secret(settings.home / KEY_FILE, lambda: Fernet.generate_key().decode())]


def secret_box(settings: Settings) -> SecretBox:
    return SecretBox(secret_keys(settings))

"""Where webhooks may send: http(s) URLs whose every address is public, unless the settings
allow private ones (OPD_WEBHOOK_ALLOW_PRIVATE). Loopback, link-local (cloud metadata),
private, shared, multicast, reserved and unspecified addresses are refused, so a webhook
cannot make the service reach its own network."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


PORT = "(?:[1-5]?[0-9]{1,4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
URL_PATTERN = rf"^https?://[A-Za-z0-9._~-]+(:{PORT})?([/?#].*)?$"
"""The URLs `split` accepts, as the OpenAPI document states them (an ASCII host name, IDNs
in punycode, or an IPv4 address; an optional port; no credentials): what it refuses, the
pattern refuses too."""


class UnsafeUrl(ValueError):
    """A URL the service must not call; the message says why, for the team. `detail` says
    more, for the operator's log only: the address a name resolved to."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


@dataclass(frozen=True)
class Target:
    """A checked URL: its host, the port and the address the request must go to."""

    scheme: str
    host: str
    port: int
    address: str


def split(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, or UnsafeUrl."""
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. a bracketed host that is no IPv6 address
        raise UnsafeUrl(f"the URL is not valid: {error}") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl("the URL must start with http:// or https://")
    if not parts.hostname:
        raise UnsafeUrl("the URL has no host")
    if parts.username or parts.password:
        raise UnsafeUrl("the URL must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise UnsafeUrl(f"the URL's port is not valid: {error}") from None
    if not re.fullmatch(URL_PATTERN, url):
        raise UnsafeUrl(
            "the URL must look like http(s)://HOST[:PORT][/PATH], its HOST an ASCII name "
            "(IDNs in punycode) or an IPv4 address, on one line"
        )
    return parts.scheme, parts.hostname, port


def forbidden(address: Address) -> str | None:
    """Why the service must not call `address`, or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind in ("unspecified", "loopback", "link_local", "multicast", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:
        return "non-public"
    return None


def check_address(host: str, address: str, allow_private: bool) -> None:
    reason = forbidden(ipaddress.ip_address(address))
    if reason is not None and not allow_private:
        raise UnsafeUrl(
            f"{host} resolves to {address}, a {reason} address; webhooks may only call public "
            "addresses (OPD_WEBHOOK_ALLOW_PRIVATE allows others)"
        )


def check_literal(url: str, allow_private: bool) -> None:
    """What can be checked without DNS, when a webhook is registered: the URL's form, and
    its host when that is an address (in any spelling the resolver reads as one) or
    `localhost`."""
    _, host, _ = split(url)
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        check_address(host, "127.0.0.1", allow_private)
        return
    address = numeric_address(host)
    if address is not None:
        check_address(host, address, allow_private)


def numeric_address(host: str) -> str | None:
    """The IPv4 address a numeric host spells, as the resolver reads it: besides the dotted
    quad, the forms `inet_aton` takes (`2130706433`, `0x7f000001`, `127.1`, `0177.0.0.1`
    are all 127.0.0.1); None for a name."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


async def resolve(url: str, allow_private: bool) -> Target:
    """The address to send to: the host's first address, after every address it resolves
    to passed the check (a request then goes to that address, so DNS cannot change its
    answer between the check and the connection)."""
    scheme, host, port = split(url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UnsafeUrl(f"cannot resolve {host}: {error.strerror}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        try:
            check_address(host, address, allow_private)
        except UnsafeUrl as error:
            # What a name resolves to inside the service's network is not the team's to see.
            raise UnsafeUrl(
                f"the destination was refused: {host} resolves to an address webhooks may not "
                "call (only public ones, unless OPD_WEBHOOK_ALLOW_PRIVATE)",
                detail=str(error),
            ) from None
    return Target(scheme, host, port, addresses[0])

"""Where webhooks may send: public http(s) addresses only, unless private ones are allowed."""

from __future__ import annotations

import re

import pytest

from app.webhooks.urls import UnsafeUrl, check_literal, resolve


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9000/hook", "loopback"),
        ("http://localhost/hook", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("https://10.1.2.3/hook", "private"),
        ("http://192.168.0.10/hook", "private"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://100.64.0.1/hook", "non-public"),
        ("http://0x7f000001/hook", "loopback"),
        ("http://2130706433/hook", "loopback"),
        ("http://127.1/hook", "loopback"),
        ("http://0177.0.0.1/hook", "loopback"),
        ("http://0xa9.0xfe.0xa9.0xfe/hook", "link-local"),
        ("http://012.1.2.3/hook", "private"),  # octal 012 is 10
    ],
)
def test_private_addresses_are_refused_unless_allowed(url, why):
    with pytest.raises(UnsafeUrl, match=f"a {why} address"):
        check_literal(url, allow_private=False)
    check_literal(url, allow_private=True)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/hook", "http:// or https://"),
        ("http://user:secret@example.com/hook", "credentials"),
        ("https:///hook", "no host"),
        ("http://example.com:99999/hook", "port"),
        ("http://[::1]/hook", "an IPv4 address"),  # IPv6 literals are refused outright
        ("http://[::ffff:10.0.0.1]/hook", "an IPv4 address"),
    ],
)
def test_urls_that_are_not_plain_http_are_refused(url, why):
    with pytest.raises(UnsafeUrl, match=why):
        check_literal(url, allow_private=True)


async def test_a_resolved_address_is_checked_and_used():
    with pytest.raises(UnsafeUrl, match="the destination was refused") as refused:
        await resolve("http://localhost:8080/hook", allow_private=False)
    assert "127.0.0.1" not in str(refused.value) and "::1" not in str(refused.value)
    assert re.search(r"resolves to (127\.0\.0\.1|::1), a loopback address", refused.value.detail)
    target = await resolve("http://localhost:8080/hook", allow_private=True)
    assert (target.host, target.port) == ("localhost", 8080)
    assert target.address in ("127.0.0.1", "::1")
    check_literal("https://0x08080808/hook", allow_private=False)  # 8.8.8.8: public
    check_literal("https://example.com/hook", allow_private=False)  # a name: checked at delivery
    public = await resolve("https://8.8.8.8/hook", allow_private=False)
    assert (public.address, public.port) == ("8.8.8.8", 443)

"""The upload fuzzer: hostile and odd files (deep nesting, huge fields, Parquet bombs,
truncated and mutated files, odd encodings; tests/hostile_uploads.py) posted to a real
`opd api` process. Every answer is a 201 or a 4xx in the error shape, the process stays
up, its peak memory (VmHWM: a bomb's memory is given back once it is read) grows by less
than RSS_GROWTH_BOUND, and no spool file is left behind; bombs sent at once are refused
alike."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Service, deployment
from tests.hostile_uploads import corpus, dictionary_bomb, good_jsonl

RSS_GROWTH_BOUND = 256 << 20
TIMEOUT = httpx.Timeout(300, connect=10)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("fuzz")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        yield running


def peak_rss(service: Service) -> int:
    """The API process's largest resident size so far."""
    status = Path(f"/proc/{service.processes[0].pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def post(service: Service, filename: str, data: bytes) -> httpx.Response:
    return httpx.post(
        f"{service.url}/v1/files",
        params={"filename": filename},
        content=data,
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=TIMEOUT,
    )


def test_no_upload_takes_the_api_down_or_its_memory_up(service: Service) -> None:
    assert post(service, "warm.jsonl", good_jsonl(3)).status_code == 201
    baseline = peak_rss(service)
    answers = {}
    for case, filename, data in corpus():
        try:
            response = post(service, filename, data())
        except httpx.TransportError as error:
            pytest.fail(f"{case}: no answer ({error!r})\n{service.logs()}")
        assert service.processes[0].poll() is None, f"{case} took the API down\n{service.logs()}"
        growth = peak_rss(service) - baseline
        assert growth < RSS_GROWTH_BOUND, f"{case}: the API grew by {growth >> 20} MiB"
        status = response.status_code
        assert status == 201 or 400 <= status < 500, f"{case}: {status} {response.text[:300]}"
        if status != 201:
            error = response.json()["error"]
            assert error["code"] and error["message"], case
        answers[case] = status if status == 201 else response.json()["error"]["code"]

    assert answers["deep lists"] == answers["deep objects"] == "file_too_complex"
    assert answers["a line of 20 MiB"] == answers["a CSV field of 20 MiB"] == "file_too_complex"
    assert answers["plain bomb"] == "file_too_complex"
    assert answers["dictionary bomb"] in ("file_too_complex", "file_unreadable")
    assert answers["Parquet text not UTF-8"] == "file_unreadable"
    assert answers["a date past 9999"] == "unusable_file"
    assert answers["brackets in a string"] == answers["good Parquet"] == 201
    assert not list((service.home / "uploads").glob("*"))


def test_bombs_sent_at_once_are_each_refused_and_the_api_lives(service: Service) -> None:
    assert post(service, "warm.jsonl", good_jsonl(5)).status_code in (200, 201)
    baseline = peak_rss(service)
    bomb = dictionary_bomb()
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: post(service, "bomb.parquet", bomb), range(3)))
    assert service.processes[0].poll() is None, service.logs()
    assert peak_rss(service) - baseline < RSS_GROWTH_BOUND
    assert [answer.status_code for answer in answers] == [422] * 3
    assert post(service, "after.jsonl", good_jsonl(6)).status_code == 201

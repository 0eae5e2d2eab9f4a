"""OPD_METRICS_LISTEN on a real `opd api` process: /metrics there without a key, and the
process still shuts down cleanly on SIGTERM (the second server stops with it)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from opd.serve import free_port
from tests.e2e.conftest import Service, deployment


def test_metrics_on_their_own_address_and_a_clean_shutdown(tmp_path: Path):
    address = f"127.0.0.1:{free_port()}"
    with deployment(tmp_path, f"sqlite:///{tmp_path / 'opd.db'}") as service:
        env = service.env | {"OPD_METRICS_LISTEN": address}
        listening = Service(tmp_path / "listening", env, f"http://127.0.0.1:{free_port()}")
        listening.home.mkdir()
        try:
            process = listening.start_api(quiet=False)
            scraped = httpx.get(f"http://{address}/metrics", timeout=10)
            assert scraped.status_code == 200
            names = {family.name for family in text_string_to_metric_families(scraped.text)}
            assert {"opd_jobs", "opd_http_requests", "opd_database_up"} <= names
            assert httpx.get(f"{listening.url}/metrics").status_code == 401, "needs a key here"
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        finally:
            listening.stop()
        assert "Application shutdown complete" in listening.logs(), listening.logs()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{address}/metrics", timeout=2)

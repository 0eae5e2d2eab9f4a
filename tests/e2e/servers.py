"""Real Redis, Postgres, S3 (moto) and MLflow servers of a test's own, to stop and start
for fault tests (the machine's shared servers stay untouched)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from opd.serve import free_port, redis_command, wait_until


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on port {port}"
        time.sleep(0.1)


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="opd-redis-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            redis_command(self.port, self.folder),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        """A hard stop: everything Redis held is gone, as in a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class PostgresServer:
    """A throwaway cluster (initdb) on a free port; as root it runs as the postgres user."""

    def __init__(self) -> None:
        self.bin = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]).parent
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="opd-pg-"))
        self.data = self.folder / "data"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "start",
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        """An immediate shutdown: connections drop mid-transaction, as in a crash."""
        self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
            user="postgres" if os.geteuid() == 0 else None,
        )
        shutil.rmtree(self.folder, ignore_errors=True)


class S3Server:
    """moto's S3 server on a free port, with one bucket (`s3://<bucket>/opd`, reached with
    `env`); what it holds lives in its memory and goes with it."""

    def __init__(self, bucket: str = "opd") -> None:
        self.port = free_port()
        self.bucket = bucket
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_url(self) -> str:
        return f"s3://{self.bucket}/opd"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The AWS_* variables that reach it (through `endpoint`, a relay, if given)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }

    def start(self) -> None:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port)
        httpx.put(f"{self.url}/{self.bucket}", timeout=10).raise_for_status()

    def remove(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None


class MlflowServer:
    """`mlflow server` on a free port, its SQLite store and artifacts in a folder of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="opd-mlflow-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--workers", "1"]
        command += ["--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}"]
        command += ["--default-artifact-root", str(self.folder / "artifacts")]
        self.process = subprocess.Popen(
            command,
            env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            stdout=(self.folder / "log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_until(self.healthy, "mlflow server", self.process)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).is_success
        except httpx.TransportError:
            return False

    def remove(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


class Relay:
    """A TCP relay on a port of its own to a server's port, listening only once started:
    to a client, a server that is down (connections refused) and then up. `answers` holds
    what the server sent on each connection; with `withhold_first`, the first connection's
    never reaches the client (an answer lost on the way: the client's read times out)."""

    def __init__(self, target_port: int, *, withhold_first: bool = False) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.withhold_first = withhold_first
        self.answers: list[bytearray] = []
        self.listener: socket.socket | None = None
        self.connections: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def stop(self) -> None:
        if self.listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept blocked on it
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None

    def cut(self) -> None:
        """Down for good: no new connection, and those open (kept alive) dropped."""
        self.stop()
        for connection in self.connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the server is down: so is this connection
                client.close()
                continue
            self.connections += [client, server]
            answer = bytearray()
            lost = self.withhold_first and not self.answers
            self.answers.append(answer)
            pumps = ((client, server, None, False), (server, client, answer, lost))
            for pump in pumps:
                threading.Thread(target=self._pump, args=pump, daemon=True).start()

    @staticmethod
    def _pump(
        source: socket.socket, sink: socket.socket, seen: bytearray | None, lost: bool
    ) -> None:
        with source, sink:
            try:
                while data := source.recv(65536):
                    if seen is not None:
                        seen += data
                    if not lost:
                        sink.sendall(data)
            except OSError:
                pass

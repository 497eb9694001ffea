"""Real ``engine serve`` subprocesses with the default model, shared by the server tests.

Three servers start side by side once per session (their model loads overlap), all on the
reference attention backend (``torch_native``) so that these tests measure the serving layer:

* ``main``: default scheduling (prefill chunk 2048), 16 running requests;
* ``aux``: ``--chunked-prefill-size 16``, ``--max-queued-requests 2``, two running requests
  ``--api-key``, ``--tool-call-parser qwen3_coder`` and ``--grammar-backend none``, for the
  chunking, 503, 401, tool-choice and refused-constraint checks;
* ``parsers``: ``--reasoning-parser qwen3 --tool-call-parser hermes``, for the reasoning and
  tool-call wiring of chat completions.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

import httpx
import pytest

START_TIMEOUT_S = 300
API_KEY = "test-secret-key"


_ports: set[int] = set()


def free_port() -> int:
    """A port nobody listens on, never one handed out before in this process: two servers
    started together must not both be told the same port (the second would fail to bind once
    its model loaded, and its URL would reach the first)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports:
            _ports.add(port)
            return port


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: str
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=timeout)

    def says_ready(self) -> bool:
        """Whether this server's log has the line it writes once it serves at its URL."""
        with open(self.log_path, errors="replace") as f:
            return any("ready: serving" in line and f" at {self.url} " in line for line in f)

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-30:])


def start_server(name: str, *args: str) -> Server:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"engine-{name}-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu", "--max-total-tokens", "12288",
           "--attention-backend", "torch_native", *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    key = args[args.index("--api-key") + 1] if "--api-key" in args else None
    return Server(name, f"http://127.0.0.1:{port}", proc, log.name, key)


def wait_ready(server: Server, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"{server.name} server exited ({server.proc.returncode}):\n"
                        f"{server.log_tail()}")
        try:
            # Ready only once this server's own log says it bound its port: a /health answer
            # alone could come from another process on that port.
            if (httpx.get(server.url + "/health", timeout=2).status_code == 200
                    and server.says_ready()):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{server.name} server not ready in {START_TIMEOUT_S} s:\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    os.unlink(server.log_path)


@contextlib.contextmanager
def running(*started: Server) -> Iterator[dict[str, Server]]:
    """Wait until every server of ``started`` is ready; stop them all on leaving (by name)."""
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for s in started:
            wait_ready(s, deadline)
        yield {s.name: s for s in started}
    finally:
        for s in started:
            stop_server(s)


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, Server]]:
    with running(
        start_server("main", "--max-running-requests", "16", "--max-queued-requests", "64"),
        start_server("aux", "--chunked-prefill-size", "16", "--max-queued-requests", "2",
                     "--max-running-requests", "2", "--api-key", API_KEY,
                     "--tool-call-parser", "qwen3_coder", "--grammar-backend", "none"),
        start_server("parsers", "--max-running-requests", "4", "--reasoning-parser", "qwen3",
                     "--tool-call-parser", "hermes"),
    ) as started:
        yield started


@pytest.fixture(scope="session")
def main_server(servers: dict[str, Server]) -> Server:
    return servers["main"]


@pytest.fixture(scope="session")
def aux_server(servers: dict[str, Server]) -> Server:
    return servers["aux"]


@pytest.fixture(scope="session")
def parser_server(servers: dict[str, Server]) -> Server:
    return servers["parsers"]

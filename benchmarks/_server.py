"""Shared by the benchmark scripts that measure a real ``engine serve`` subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, log_path: str, poll_s: float = 0.5) -> bool:
    """Poll ``url``/health until it answers 200 (True); False, with the end of the server's
    log printed to stderr, when the server exits first."""
    while True:
        if proc.poll() is not None:
            print(open(log_path).read()[-3000:], file=sys.stderr)
            return False
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (the server drains), then SIGKILL if it has not exited within ``timeout`` s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

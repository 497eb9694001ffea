"""Shared by the benchmark scripts that measure a real ``engine serve`` subprocess."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_events(conn: http.client.HTTPConnection, path: str,
                  body: dict) -> Iterator[dict]:
    """POST ``body`` as JSON to ``path`` over ``conn`` (kept alive between calls) and yield the
    JSON object of each server-sent event as it arrives, up to ``[DONE]``. The standard
    library's client: per request it costs the client ~0.5-1 ms less than httpx (measured on a
    2-core machine against /health), which a time-to-first-token benchmark would count as the
    server's."""
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:500]!r}")
    try:
        while True:
            line = r.readline()
            if not line:
                return
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return
            yield json.loads(data)
    finally:
        r.read()  # the rest, so the connection can take the next request


def wait_ready(proc: subprocess.Popen, url: str, log_path: str, poll_s: float = 0.5,
               path: str = "/health") -> bool:
    """Poll ``url`` + ``path`` until it answers 200 (True); False, with the end of the server's
    log printed to stderr, when the server exits first."""
    while True:
        if proc.poll() is not None:
            print(open(log_path).read()[-3000:], file=sys.stderr)
            return False
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
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


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ProcTree:
    """Samples a process and its descendants every ``period`` s in a thread: the peak resident
    set (the sum over the processes of each one's VmHWM, /proc/<pid>/status) and CPU seconds
    used (each process's last reading). ``close()`` stops it; read ``peak_rss_mib`` and
    ``cpu_s`` then (or any time)."""

    def __init__(self, pid: int, period: float = 0.2):
        self.pid, self.period = pid, period
        self.hwm: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        for p in [self.pid, *_children(self.pid)]:
            self.hwm[p] = max(self.hwm.get(p, 0), _hwm_kib(p))
            c = cpu_seconds(p)
            if c:
                self.cpu[p] = max(self.cpu.get(p, 0.0), c)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def close(self) -> None:
        """Last sample, then stop (call before the process is stopped)."""
        self.sample()
        self._stop.set()
        self._thread.join()

    @property
    def peak_rss_mib(self) -> float:
        return sum(self.hwm.values()) / 1024

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())


def new_session(nice: int = 0) -> None:
    """For ``preexec_fn``: put the child in a new session, thus its own scheduler autogroup (as
    a program started from another terminal: with autogroups the kernel shares the CPU between
    sessions first), with niceness ``nice`` for that autogroup and the process (negative:
    root)."""
    os.setsid()
    if nice:
        prioritize(nice)


def prioritize(nice: int) -> None:
    """Niceness ``nice`` for this process and its autogroup (with autogroups a process's own
    nice value only ranks it within its session); a no-op where not permitted."""
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass

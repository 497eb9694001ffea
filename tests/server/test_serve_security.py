"""Hostile or careless clients against a real server, each while a greedy request runs beside
them: that request must answer exactly what it answers alone, and the server stays healthy.

Covers bad text and bodies (400 naming the field), refused fields and request limits, the Host,
Origin and content-type rules of a keyless server, CORS, the admin key, slow and idle
connections, the SIGTERM drain, and the log of a client that leaves. Two extra servers:
``guarded`` (allowed hosts, CORS, admin key, short read timeout, small connection limit) and
``draining`` (short grace period; the drain test shuts it down).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator

import httpx
import pytest
from conftest import Server, running, start_server
from test_serve_errors import CASES, post

pytestmark = pytest.mark.slow

HANG_S = 120  #: a guard against hangs only; nothing here waits on a timing
ADMIN_KEY = "admin-secret"
READ_TIMEOUT_S = 3
CONNECTION_LIMIT = 12
GRACE_S = 8
COMPL, CHAT = "/v1/completions", "/v1/chat/completions"
PROBE = {"prompt": "List three colours:", "max_tokens": 32, "temperature": 0}


@pytest.fixture(scope="module")
def extra_servers() -> Iterator[dict[str, Server]]:
    with running(
            start_server("guarded", "--admin-api-key", ADMIN_KEY,
                         "--allowed-hosts", "engine.example,*.corp.example",
                         "--cors-allow-origins", "https://app.example",
                         "--request-read-timeout", str(READ_TIMEOUT_S),
                         "--limit-concurrency", str(CONNECTION_LIMIT),
                         "--max-running-requests", "4"),
            start_server("draining", "--timeout-graceful-shutdown", str(GRACE_S),
                         "--max-running-requests", "4"),
    ) as started:
        yield started


@pytest.fixture(scope="module")
def guarded(extra_servers: dict[str, Server]) -> Server:
    return extra_servers["guarded"]


@pytest.fixture(scope="module")
def draining(extra_servers: dict[str, Server]) -> Server:
    return extra_servers["draining"]


def complete(server: Server, body: dict[str, Any] = PROBE) -> str:
    with server.client(timeout=HANG_S) as c:
        r = c.post(COMPL, json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


_solo: dict[str, str] = {}


@contextmanager
def bystander(server: Server) -> Iterator[None]:
    """A greedy completion in flight while the block runs: it must answer what it answers
    alone, and the server must answer ``/health`` afterwards."""
    if server.url not in _solo:
        _solo[server.url] = complete(server)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(complete, server)
        yield
        assert running.result(timeout=HANG_S) == _solo[server.url]
    assert httpx.get(server.url + "/health", timeout=HANG_S).status_code == 200


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    return err


def escaped(body: dict[str, Any]) -> bytes:
    """JSON with non-ASCII as ``\\u`` escapes: the way to send a lone surrogate."""
    return json.dumps(body).encode()


# ---------------------------------------------------------------------- bodies and fields


def test_every_bad_request_at_once_leaves_the_others_alone(main_server) -> None:
    """All the 4xx cases of test_serve_errors, sent together while a greedy request runs."""
    def check(case: tuple) -> None:
        _, path, body, status, param, words = case
        with main_server.client(timeout=HANG_S) as c:
            err = error_of(post(c, path, body), status)
        assert err["param"] == param and words.lower() in err["message"].lower(), err

    with bystander(main_server), ThreadPoolExecutor(8) as pool:
        list(pool.map(check, CASES))


@pytest.mark.parametrize("path,body,param,where", [
    (COMPL, {"prompt": "a\ud800b"}, "prompt", "prompt"),
    (COMPL, {"prompt": ["ok", "\udfff"], "stream": True}, "prompt", "prompt[1]"),
    ("/generate", {"text": "\ud800", "stream": True}, "text", "text"),
    ("/generate", {"text": "a", "rid": "\ud800"}, "rid", "rid"),
    (CHAT, {"model": "\ud800", "messages": [{"role": "user", "content": "x"}]}, "model",
     "model"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}],
     "stream": True}, "messages", "messages[0].content[0].text"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "tool_choice": {
        "type": "function", "function": {"name": "\ud800"}}}, "tool_choice",
     "tool_choice.function.name"),
])
def test_text_that_is_not_utf8_is_400_naming_the_field(main_server, path, body, param,
                                                       where) -> None:
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        err = error_of(post(c, path, escaped(body)), 400)
    assert err["param"] == param
    assert err["message"].startswith(f"{where} is not valid text") and "surrogate" in \
        err["message"]


def test_unsupported_fields_are_refused_and_text_format_accepted(main_server) -> None:
    msg = [{"role": "user", "content": "Hi"}]
    refused = [
        (COMPL, {"prompt": "x", "best_of": 4}, "best_of"),
        (CHAT, {"messages": msg, "response_format": {"type": "no such type"}}, "response_format"),
        (CHAT, {"messages": msg, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": "a string"}}]}, "tools"),
    ]
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        for path, body, param in refused:
            err = error_of(c.post(path, json={**body, "max_tokens": 2}), 400)
            assert err["param"] == param, err
        ok = c.post(CHAT, json={"messages": msg, "max_tokens": 2, "logit_bias": {},
                                "response_format": {"type": "text"}})
        assert ok.status_code == 200, ok.text


def test_the_work_of_one_request_is_bounded(main_server) -> None:
    """n, batch size, stop strings and tools beyond the limits: a quick 400 naming the flag."""
    msg = [{"role": "user", "content": "Hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = [
        (COMPL, {"prompt": "x", "n": 2000}, "n", "--max-sequences-per-request"),
        (CHAT, {"messages": msg, "n": 257}, "n", "--max-sequences-per-request"),
        ("/generate", {"text": ["x"] * 300}, "text", "--max-sequences-per-request"),
        (COMPL, {"prompt": ["x"] * 64, "n": 5}, "prompt", "--max-sequences-per-request"),
        (COMPL, {"prompt": "x", "stop": ["s" * 2000] * 1000}, "stop", "--max-stop-strings"),
        (CHAT, {"messages": msg, "stop": ["s" * 513]}, "stop", "--max-stop-length"),
        ("/generate", {"text": "x", "sampling_params": {"stop": ["s"] * 33}}, "stop",
         "--max-stop-strings"),
        (CHAT, {"messages": msg, "tools": [tool] * 129}, "tools", "--max-tools"),
        (CHAT, {"messages": msg, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
         "<= 20"),
    ]
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        for path, body, param, words in cases:
            err = error_of(c.post(path, json=body), 400)
            assert err["param"] == param and words in err["message"], err
        assert c.post(COMPL, json={"prompt": "x", "max_tokens": 1, "n": 4,
                                   "stop": ["s" * 512] * 32}).status_code == 200


# ---------------------------------------------------------------------- a keyless server


def test_json_routes_need_a_json_content_type(main_server) -> None:
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                      None):
            headers = {"content-type": ctype} if ctype else {}
            r = c.post(COMPL, content=body, headers=headers)
            err = error_of(r, 415)
            assert "application/json" in err["message"]
        r = c.post(COMPL, content=body, headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text


def test_a_keyless_server_answers_only_its_own_host_names(main_server) -> None:
    port = main_server.url.rsplit(":", 1)[1]
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}",
                     f"evil.example@127.0.0.1:{port}"):
            err = error_of(c.get("/v1/models", headers={"host": host}), 403)
            assert "--allowed-hosts" in err["message"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host


def test_cross_origin_requests_are_refused_without_cors(main_server) -> None:
    evil = {"origin": "https://evil.example"}
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        err = error_of(c.post(COMPL, json={"prompt": "x", "max_tokens": 1}, headers=evil), 403)
        assert "--cors-allow-origins" in err["message"]
        error_of(c.get("/v1/models", headers=evil), 403)
        error_of(c.post("/flush_cache", headers=evil), 403)
        preflight = c.options(COMPL, headers={**evil, "access-control-request-method": "POST"})
        assert preflight.status_code == 403
        assert "access-control-allow-origin" not in preflight.headers
        same = c.post(COMPL, json={"prompt": "x", "max_tokens": 1},
                      headers={"origin": main_server.url})
        assert same.status_code == 200, same.text


def test_flush_cache_is_post_only(main_server) -> None:
    with bystander(main_server), main_server.client(timeout=HANG_S) as c:
        error_of(c.get("/flush_cache"), 405)
        assert c.post("/flush_cache").status_code == 200


def test_with_an_api_key_any_host_may_be_named_and_keys_must_match(aux_server) -> None:
    with aux_server.client(timeout=HANG_S) as c:
        assert c.get("/v1/models", headers={"host": "engine.internal"}).status_code == 200
        wrong = "x" * len(aux_server.api_key or "")
        r = c.get("/v1/models", headers={"authorization": f"Bearer {wrong}"})
        assert error_of(r, 401)["type"] == "authentication_error"
        r = c.get("/v1/models", headers={"authorization": "", "x-api-key": aux_server.api_key})
        assert r.status_code == 200


def test_allowed_hosts_and_cors_origins(guarded) -> None:
    app = {"origin": "https://app.example"}
    with bystander(guarded), guarded.client(timeout=HANG_S) as c:
        for host in ("engine.example", "ENGINE.example:8080", "a.corp.example"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
        for host in ("corp.example", "evil.example"):
            error_of(c.get("/v1/models", headers={"host": host}), 403)
        r = c.post(COMPL, json={"prompt": "x", "max_tokens": 1}, headers=app)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        preflight = c.options(COMPL, headers={**app, "access-control-request-method": "POST",
                                              "access-control-request-headers": "content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        error_of(c.post(COMPL, json={"prompt": "x", "max_tokens": 1},
                        headers={"origin": "https://evil.example"}), 403)


def test_admin_routes_need_the_admin_key(guarded) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with bystander(guarded), guarded.client(timeout=HANG_S) as c:
        for method, path in (("POST", "/flush_cache"), ("GET", "/get_server_info"),
                             ("GET", "/server_info")):
            err = error_of(c.request(method, path), 401)
            assert "admin API key" in err["message"]
            error_of(c.request(method, path, headers={"authorization": "Bearer nope"}), 401)
            assert c.request(method, path, headers=admin).status_code == 200
        info = c.get("/get_server_info", headers=admin).json()
        assert info["admin_api_key"] == "***"
        assert c.get("/v1/models").status_code == 200  # no --api-key: other routes are open


# ---------------------------------------------------------------------- connections


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a hang guard: HANG_S)."""
    sock.settimeout(HANG_S)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_slow_and_idle_connections_are_closed(guarded) -> None:
    host, port = guarded.url.removeprefix("http://").split(":")
    head = (f"POST {COMPL} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n").encode()
    with bystander(guarded):
        silent = socket.create_connection((host, int(port)))
        trickling = socket.create_connection((host, int(port)))
        trickling.sendall(head[:30])
        slow_body = socket.create_connection((host, int(port)))
        slow_body.sendall(head + b'{"prompt": ')
        with silent, trickling, slow_body:
            assert read_all(silent) == b""
            assert read_all(trickling) == b""
            answer = read_all(slow_body)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"--request-read-timeout" in answer


def test_connections_beyond_the_limit_get_503(guarded) -> None:
    host, port = guarded.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(CONNECTION_LIMIT)]
    try:
        assert httpx.get(guarded.url + "/v1/models", timeout=HANG_S).status_code == 503
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + HANG_S
    while httpx.get(guarded.url + "/v1/models", timeout=HANG_S).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_client_leaving_is_one_info_line(main_server) -> None:
    start = os.path.getsize(main_server.log_path)
    with bystander(main_server), main_server.client(timeout=1.0) as c:
        with pytest.raises(httpx.TimeoutException):
            c.post(COMPL, json={"prompt": "Tell a long story.", "max_tokens": 2000,
                                "ignore_eos": True})
        deadline = time.monotonic() + HANG_S
        while "client disconnected" not in (log := new_log(main_server, start)):
            assert time.monotonic() < deadline, log
            time.sleep(0.2)
    log = new_log(main_server, start)
    assert "ERROR" not in log and "Traceback" not in log, log
    assert [line for line in log.splitlines() if "client disconnected" in line][0].split()[2] \
        == "INFO"


def new_log(server: Server, start: int) -> str:
    with open(server.log_path, errors="replace") as f:
        f.seek(start)
        return f.read()


# ---------------------------------------------------------------------- overload and shutdown


def sse_events(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def test_sigterm_drains_then_ends_what_is_left_cleanly(draining) -> None:
    """In flight at SIGTERM: a short stream finishes as if nothing happened; new requests get
    503 + Retry-After; after the grace period a long stream ends with an error event and [DONE]
    and a long non-streamed request with a JSON 503; then the server exits with status 0."""
    url = draining.url
    short = {**PROBE, "stream": True}
    long = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
            "temperature": 0}
    expected = complete(draining)
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=HANG_S) as c:
        plain = pool.submit(c.post, COMPL, json=long)
        with c.stream("POST", COMPL, json={**long, "stream": True}) as long_stream:
            long_events = sse_events(long_stream.iter_lines())
            next(long_events)
            deadline = time.monotonic() + HANG_S
            while c.get("/get_server_info").json()["scheduler"]["num_running"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with c.stream("POST", COMPL, json=short) as short_stream:
                short_events = sse_events(short_stream.iter_lines())
                text = next(short_events)["choices"][0]["text"]
                draining.proc.send_signal(signal.SIGTERM)
                while (health := c.get("/health")).status_code == 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                assert error_of(health, 503)["code"] == "shutting_down"
                refused = c.post(COMPL, json={"prompt": "x", "max_tokens": 1})
                assert error_of(refused, 503)["code"] == "shutting_down"
                assert refused.headers["retry-after"].isdigit()
                rest = list(short_events)
            assert rest[-1] == "[DONE]" and not any("error" in e for e in rest[:-1])
            assert text + "".join(e["choices"][0]["text"] for e in rest[:-1]) == expected
            *_, error, done = long_events
        assert done == "[DONE]" and error["error"]["code"] == "shutting_down"
        cut = plain.result(timeout=HANG_S)
        assert error_of(cut, 503)["code"] == "shutting_down"
        assert cut.headers["retry-after"].isdigit()
    assert draining.proc.wait(timeout=HANG_S) == 0

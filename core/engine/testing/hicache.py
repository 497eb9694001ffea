"""Conformance suite of the hicache_storage family (``engine plugins check NAME``).

Every store must pass, with pages of the length the core uses:

* get / set / exists of one page, with and without a target buffer; a missing key is ``None``
  and ``False``;
* batches, and partial batches (a missing key in the middle: ``None`` there, and
  ``batch_exists`` counting only the leading present keys);
* concurrent writers (threads writing the same and different keys: every key ends up holding
  exactly one of the values written to it);
* an interrupted write: a forked writer is killed at each point of its ``set`` in turn (the
  N-th C call it makes); afterwards the key holds nothing or the whole page, and a new ``set``
  works (skipped for a store whose client cannot write from a forked process at all);
* a corrupted and a short page stored under a key: the core's page codec refuses both (so the
  store's bytes are never served as KV).

``check(name, product)`` builds the store through the plugin's hook with its options and the
extra config given to ``engine plugins check NAME --extra-config JSON`` (a Mooncake master's
address, the mock 3FS client...); :func:`run` takes any store factory.
:func:`mooncake_master` starts a local Mooncake master for tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from engine.api.hicache import PAGE_HEADER_BYTES, StorageConfig
from engine.runtime.page_store import PageCodec

PAYLOAD_BYTES = 4096


def _key(rng: random.Random) -> str:
    return f"{rng.getrandbits(256):064x}"


def _page(codec: PageCodec, key: str, rng: random.Random) -> bytearray:
    return codec.encode(key, bytes(rng.getrandbits(8) for _ in range(64)) * (
        codec.payload_bytes // 64))


def run(make: Callable[[StorageConfig], Any], *, payload_bytes: int = PAYLOAD_BYTES,
        interrupt_points: int = 8, seed: int = 0) -> list[str]:
    """Run the suite on the store ``make(storage_config)`` builds; the failures, as lines."""
    codec = PageCodec(payload_bytes)
    store = make(StorageConfig(page_bytes=codec.page_bytes, identity="0" * 64,
                               model_name="conformance"))
    rng = random.Random(seed)
    fails: list[str] = []

    def expect(cond: bool, what: str) -> None:
        if not cond:
            fails.append(what)

    def same(got: Any, want: Any) -> bool:
        return got is not None and bytes(memoryview(got).cast("B")) == bytes(want)

    # one page
    k, missing = _key(rng), _key(rng)
    v = _page(codec, k, rng)
    expect(store.get(missing) is None, "get of a missing key is not None")
    expect(not store.exists(missing), "exists of a missing key is true")
    expect(store.set(k, v) is True, "set of one page did not return True")
    expect(store.exists(k), "exists is false after set")
    expect(same(store.get(k), v), "get does not return the page set")
    target = memoryview(bytearray(codec.page_bytes))
    expect(same(store.get(k, target), v), "get into a target buffer does not return the page")
    expect(store.set(k, v) is True, "setting an existing key again did not return True")
    # batches and partial batches
    keys = [_key(rng) for _ in range(5)]
    vals = [_page(codec, key, rng) for key in keys]
    expect(store.batch_set(keys, vals) is True, "batch_set did not return True")
    got = store.batch_get(keys, [memoryview(bytearray(codec.page_bytes)) for _ in keys])
    expect(len(got) == 5 and all(same(g, w) for g, w in zip(got, vals)),
           "batch_get does not return the pages batch_set stored")
    expect(store.batch_exists(keys) == 5, "batch_exists of 5 stored keys is not 5")
    partial = keys[:2] + [missing] + keys[2:]
    got = store.batch_get(partial)
    expect(len(got) == 6 and got[2] is None and same(got[0], vals[0]) and same(got[3], vals[2]),
           "a partial batch_get is not None exactly at the missing key")
    expect(store.batch_exists(partial) == 2, "batch_exists does not stop at the first miss")
    # concurrent writers
    shared = [_key(rng) for _ in range(4)]
    written: dict[str, list[bytes]] = {s: [] for s in shared}
    errors: list[str] = []

    def writer(i: int) -> None:
        r = random.Random(seed * 100 + i)
        try:
            for s in shared:
                page = _page(codec, s, r)
                written[s].append(bytes(page))
                store.set(s, page)
            own = _key(r)
            page = _page(codec, own, r)
            store.set(own, page)
            if not same(store.get(own), page):
                errors.append("a page written by one of several threads reads back wrong")
        except Exception as exc:  # noqa: BLE001 - reported as a failure
            errors.append(f"a concurrent writer raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    fails.extend(sorted(set(errors)))
    for s in shared:
        got = store.get(s)
        expect(got is not None and bytes(memoryview(got).cast("B")) in written[s],
               "a key written concurrently holds none of the values written to it")
    # an interrupted write
    if hasattr(os, "fork") and interrupt_points > 0:
        fails.extend(_interrupted(store, codec, rng, interrupt_points))
    # corrupted and short pages never pass the codec
    bad, short = _key(rng), _key(rng)
    page = _page(codec, bad, rng)
    page[PAGE_HEADER_BYTES + 7] ^= 0xFF
    store.set(bad, page)
    expect(codec.decode(bad, store.get(bad)) is None, "a corrupted page passed the page check")
    store.set(short, _page(codec, short, rng)[:-100])
    expect(codec.decode(short, store.get(short)) is None, "a short page passed the page check")
    expect(codec.decode(k, store.get(k)) is not None, "an intact page failed the page check")
    try:
        store.close()
    except Exception as exc:  # noqa: BLE001
        fails.append(f"close raised {type(exc).__name__}: {exc}")
    return fails


def _in_child(fn: Callable[[], int], timeout: float = 20.0) -> int | None:
    """Run ``fn`` in a forked child; its exit status (``fn``'s value, or the kill), or None
    when it had not ended after ``timeout`` seconds (it is killed: a store whose client cannot
    work in a forked process, such as one with native I/O threads)."""
    import signal
    import time

    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = fn()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def _interrupted(store: Any, codec: PageCodec, rng: random.Random, points: int) -> list[str]:
    dry_key = _key(rng)
    dry_page = _page(codec, dry_key, rng)
    r, w = os.pipe()

    def count() -> int:
        calls = [0]

        def prof(frame: Any, event: str, arg: Any) -> None:
            if event == "c_call":
                calls[0] += 1

        sys.setprofile(prof)
        store.set(dry_key, dry_page)
        sys.setprofile(None)
        os.write(w, str(calls[0]).encode())
        return 0

    finished = _in_child(count)
    os.close(w)
    total = int(os.read(r, 64) or b"0")
    os.close(r)
    fails: list[str] = []
    if finished is None:  # the store cannot write from a forked process: nothing to interrupt
        return fails
    stops = sorted({max(1, total * i // points) for i in range(points)}) if total else []
    for stop in stops:
        key = _key(rng)
        page = _page(codec, key, rng)

        def die_at(stop: int = stop, key: str = key, page: bytearray = page) -> int:
            calls = [0]

            def prof(frame: Any, event: str, arg: Any) -> None:
                if event == "c_call":
                    calls[0] += 1
                    if calls[0] >= stop:
                        os._exit(9)

            sys.setprofile(prof)
            store.set(key, page)
            sys.setprofile(None)
            return 0

        _in_child(die_at)
        got = store.get(key)
        if got is not None and bytes(memoryview(got).cast("B")) != bytes(page):
            fails.append(f"a write killed at C call {stop} of {total} left a torn page")
            break
        store.set(key, page)
        got = store.get(key)
        if got is None or bytes(memoryview(got).cast("B")) != bytes(page):
            fails.append(f"after a write killed at C call {stop}, setting the key again fails")
            break
    return fails


def check(name: str, product: Any) -> list[str]:
    """``engine plugins check``: the suite on the plugin's store, built with its options and
    the backend part of ``--hicache-storage-backend-extra-config`` (``--extra-config``)."""
    import dataclasses

    from engine.config import load_extra_config
    from engine.runtime.page_store import CORE_KEYS

    config = product.config
    extra = {k: v for k, v in load_extra_config(
        config.hicache_storage_backend_extra_config).items() if k not in CORE_KEYS}
    return run(lambda sc: product(config=config,
                                  storage_config=dataclasses.replace(sc, extra=extra)))


@contextlib.contextmanager
def mooncake_master(timeout: float = 60.0) -> Iterator[tuple[str, str]]:
    """A local ``mooncake_master`` (the client package's binary beside this Python, as
    tools/hicache/mooncake_master.sh starts it) on two free loopback ports, with its HTTP
    metadata server: yields (master address, metadata server URL); stopped on exit."""
    import socket
    import subprocess
    import time
    from pathlib import Path

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    rpc, http = free_port(), free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mooncake_master"), f"--rpc_port={rpc}",
         "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
         f"--http_metadata_server_port={http}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError("mooncake_master exited at start")
            try:
                for port in (rpc, http):
                    socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mooncake_master did not listen in {timeout:.0f} s")
                time.sleep(0.2)
        yield f"127.0.0.1:{rpc}", f"http://127.0.0.1:{http}/metadata"
    finally:
        proc.terminate()
        proc.wait(20)

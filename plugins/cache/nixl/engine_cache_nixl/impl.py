"""``--hicache-storage-backend nixl``: one file per page; the bytes move between a registered
host buffer and the file through a NIXL agent's file backend (``POSIX``; extra config
``plugin``: ``POSIX``, ``GDS``, ``GDS_MT``...). Writes go to a temporary file renamed into
place, as the file store does, so an interrupted write never leaves a torn page."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage


def _load_nixl() -> Any:
    for module in ("nixl_cu12", "nixl_cu13", "nixl"):
        try:
            return __import__(module)
        except ImportError:
            continue
    raise PluginError("no NIXL Python package could be imported (nixl-cu12 or nixl-cu13)")


class NixlStorage(HiCacheStorage):
    def __init__(self, root: str, page_bytes: int, plugin: str) -> None:
        import numpy as np

        nixl = _load_nixl()
        self.root, self.page_bytes, self.plugin = root, page_bytes, plugin
        os.makedirs(root, exist_ok=True)
        self.name = f"engine-hicache-{os.getpid()}-{id(self):x}"
        self.agent = nixl.nixl_agent(self.name, nixl.nixl_agent_config(backends=[]))
        if plugin not in self.agent.get_plugin_list():
            raise PluginError(f"NIXL has no {plugin} plugin here "
                              f"(it has {', '.join(self.agent.get_plugin_list())})")
        self.agent.create_backend(plugin, {})
        self.buf = np.zeros(page_bytes, dtype=np.uint8)
        self.addr = self.buf.ctypes.data
        self.reg = self.agent.register_memory([(self.addr, page_bytes, 0, "")], "DRAM")
        self._lock = threading.Lock()

    def _path(self, key: str) -> str:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a page key: {key!r}")
        return os.path.join(self.root, key + ".kv")

    def _xfer(self, op: str, fd: int) -> None:
        a = self.agent
        freg = a.register_memory([(0, self.page_bytes, fd, "")], "FILE")
        try:
            src = a.get_xfer_descs([(self.addr, self.page_bytes, 0)], "DRAM")
            dst = a.get_xfer_descs([(0, self.page_bytes, fd)], "FILE")
            handle = a.initialize_xfer(op, src, dst, self.name)
            try:
                state = a.transfer(handle)
                while state not in ("DONE", "ERR"):
                    time.sleep(0.0002)
                    state = a.check_xfer_state(handle)
                if state == "ERR":
                    raise OSError(f"NIXL {self.plugin} {op} failed")
            finally:
                a.release_xfer_handle(handle)
        finally:
            a.deregister_memory(freg)

    def get(self, key: str, target: Any = None) -> Any | None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != self.page_bytes:
                return None
            with self._lock:
                self._xfer("READ", fd)
                data = self.buf.tobytes()
        finally:
            os.close(fd)
        if target is not None:
            target[:len(data)] = data
            return target
        return data

    def set(self, key: str, value: Any) -> bool:
        path = self._path(key)
        if os.path.exists(path):
            return True
        view = memoryview(value).cast("B")
        if len(view) != self.page_bytes:
            return False
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                with self._lock:
                    self.buf[:] = view
                    self._xfer("WRITE", fd)
            finally:
                os.close(fd)
            if os.path.getsize(tmp) != self.page_bytes:
                raise OSError("short write")
            os.replace(tmp, path)
            return True
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self.reg)
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


@hookimpl
def engine_create_hicache_storage(options: Any, storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    root = str(extra.pop("path", options.hicache_nixl_dir))
    plugin = str(extra.pop("plugin", "POSIX"))
    if extra:
        raise PluginError(f"unknown extra config keys for nixl: {', '.join(sorted(extra))} "
                          "(it takes path, plugin)")
    return NixlStorage(root, storage_config.page_bytes, plugin)

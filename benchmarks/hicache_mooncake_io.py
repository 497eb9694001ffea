"""Reading pages back from a Mooncake store: the copying path (``get_batch``: the client returns
new bytes objects) against the zero-copy one (the core's targets, slices of one buffer,
registered and read into with ``batch_get_into``), through the mooncake plugin, on a local
master over loopback TCP (``engine.testing.hicache.mooncake_master``). Prints a table; needs the Mooncake
client (tools/hicache/setup_backends.sh mooncake).

    python benchmarks/hicache_mooncake_io.py [--pages 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from engine.api.hicache import StorageConfig
    from engine.testing.hicache import mooncake_master
    from engine_cache_mooncake.impl import engine_create_hicache_storage

    with mooncake_master() as (master, meta):
        print("| page KiB | pages | copying get_batch ms | zero-copy ms | speed-up |")
        print("|---|---|---|---|---|")
        for kib in (64, 256, 1024):
            size = kib * 1024
            extra = {"master_server_address": master, "metadata_server": meta,
                     "global_segment_size": 2 * args.pages * size + 64 * 2**20,
                     "local_buffer_size": args.pages * size + 16 * 2**20,
                     "zero_copy_min_page_bytes": 0}  # both paths at every size
            store = engine_create_hicache_storage(storage_config=StorageConfig(
                page_bytes=size, identity=f"{kib:064x}", extra=extra))
            keys = [f"{i:064x}" for i in range(args.pages)]
            store.batch_set(keys, [os.urandom(size) for _ in keys])
            times: dict[str, list[float]] = {"copy": [], "zero": []}
            for _ in range(args.rounds):
                for kind in ("copy", "zero"):
                    if kind == "zero":
                        arena = memoryview(bytearray(size * len(keys)))
                        targets = [arena[i * size:(i + 1) * size] for i in range(len(keys))]
                    else:
                        targets = None
                    t0 = time.perf_counter()
                    got = store.batch_get(keys, targets)
                    times[kind].append(time.perf_counter() - t0)
                    assert all(g is not None for g in got)
            copy, zero = (statistics.median(times[k]) * 1e3 for k in ("copy", "zero"))
            print(f"| {kib} | {args.pages} | {copy:.1f} | {zero:.1f} | {copy / zero:.1f}x |",
                  flush=True)
            store.clear()
            store.close()


if __name__ == "__main__":
    main()

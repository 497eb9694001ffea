"""A sampling profiler for any Python process started with this folder on ``PYTHONPATH`` and
``ENGINE_STACK_SAMPLES=DIR`` set: a daemon thread reads every thread's stack every 2 ms and
writes the counts of collapsed stacks (``thread;outer;...;inner count``) to
``DIR/stacks-<pid>.txt`` every 5 s. Needs no ptrace. Summarise with
``python3 benchmarks/stack_sampler/summary.py DIR/stacks-<pid>.txt``."""

import os
import sys
import threading
import time
from collections import Counter

_DIR = os.environ.get("ENGINE_STACK_SAMPLES")


def _run(path: str) -> None:
    me = threading.get_ident()
    counts: Counter = Counter()
    last = time.monotonic()
    while True:
        time.sleep(0.002)
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            parts = []
            while frame is not None and len(parts) < 40:
                code = frame.f_code
                parts.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:"
                             f"{frame.f_lineno})")
                frame = frame.f_back
            counts[";".join([names.get(ident, str(ident))] + parts[::-1])] += 1
        if time.monotonic() - last > 5:
            last = time.monotonic()
            with open(path + ".tmp", "w") as fh:
                fh.write(" ".join(sys.argv[:4]) + "\n")
                for stack, n in counts.most_common():
                    fh.write(f"{stack} {n}\n")
            os.replace(path + ".tmp", path)


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    threading.Thread(target=_run, args=(os.path.join(_DIR, f"stacks-{os.getpid()}.txt"),),
                     name="stack-sampler", daemon=True).start()

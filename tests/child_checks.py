"""Checks that run as a script in a child process (the Triton interpreter is chosen by the
environment before Triton is imported) and print their result as JSON on their last line."""

import json
import os
import subprocess
import sys


def run_checks(script: str, *args, env: dict | None = None, timeout: int = 900):
    """Run ``script`` with ``args`` under this Python and ``env`` added to the environment;
    the JSON value its last line of output holds (the run must succeed)."""
    proc = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

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


def gpu_failures(script: str, env: dict | None = None, timeout: int = 600) -> str:
    """Run a checks script on the GPU (``script cuda``: it prints {case: [failure, ...]}) and
    return its failures, one a line ("" when none); the calling test skips without CUDA."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    results = run_checks(script, "cuda", env=env, timeout=timeout)
    return "\n".join(f for fs in results.values() for f in fs)

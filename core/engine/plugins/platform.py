"""Cheap facts about this machine, for availability checks. Never imports torch.

``ENGINE_DEVICE`` (``cpu``, ``cuda``...) overrides device detection, and
``ENGINE_COMPUTE_CAPABILITY`` (``9.0``) the compute capability; both exist for tests and for
machines where detection cannot see the device.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class PlatformFacts:
    devices: tuple[str, ...]  #: device kinds present, "cpu" always
    compute_capability: tuple[int, int] | None  #: of CUDA device 0
    cpu_features: frozenset[str]
    os: str

    def describe(self) -> str:
        cc = self.compute_capability
        extra = f" (SM{cc[0]}{cc[1]})" if cc else ""
        return "+".join(self.devices) + extra


def _torch_build() -> str | None:
    """torch's version string (``2.13.0+cpu``) from its dist-info folder name, without
    importing importlib.metadata."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n.startswith("torch-") and n.endswith(".dist-info"):
                return n[len("torch-"):-len(".dist-info")]
    return None


def _cuda_capability() -> tuple[int, int] | None:
    env = os.environ.get("ENGINE_COMPUTE_CAPABILITY")
    if env:
        major, _, minor = env.partition(".")
        return int(major), int(minor or 0)
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.split()
        major, _, minor = out[0].partition(".")
        return int(major), int(minor or 0)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def _cpu_features() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def facts() -> PlatformFacts:
    """Detect once per process."""
    forced = os.environ.get("ENGINE_DEVICE")
    devices: list[str] = ["cpu"]
    cc = None
    if forced:
        devices = sorted({"cpu", *forced.split(",")})
        cc = _cuda_capability() if "cuda" in devices else None
    else:
        torch_version = _torch_build() or ""
        has_driver = os.path.exists("/proc/driver/nvidia/version")
        if has_driver and "+cpu" not in torch_version:
            devices.append("cuda")
            cc = _cuda_capability()
        if os.path.exists("/dev/kfd") and "rocm" in torch_version:
            devices.append("rocm")
    return PlatformFacts(tuple(devices), cc, _cpu_features(), sys.platform)

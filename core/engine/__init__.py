"""engine: an LLM inference server whose every backend is a plugin.

``from engine import Engine`` gives the offline API; importing ``engine`` itself is light (no torch).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["Engine", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from engine.runtime.offline import Engine

        return Engine
    if name == "SamplingParams":
        from engine.runtime.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

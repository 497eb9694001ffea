"""auto model-config parser: mistral for a Mistral-native directory, else hf."""

from __future__ import annotations

import os
from typing import Any

from engine.api import hookimpl


def choose(model_path: str) -> str:
    """``mistral`` when the directory has params.json and no config.json, else ``hf``."""
    is_dir = os.path.isdir(model_path)
    native = is_dir and os.path.isfile(os.path.join(model_path, "params.json")) \
        and not os.path.isfile(os.path.join(model_path, "config.json"))
    return "mistral" if native else "hf"


@hookimpl
def engine_parse_model_config(model_path: str, delegate: Any) -> Any:
    """Delegate to the chosen parser (built with its own options by the assembly)."""
    return delegate(choose(model_path))

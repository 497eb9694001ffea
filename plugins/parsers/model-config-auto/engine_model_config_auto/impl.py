"""auto model-config parser: mistral for a Mistral-native directory, else hf."""

from __future__ import annotations

import os
from typing import Any

from engine.plugins import hookimpl
from engine.plugins.registry import get_registry


def choose(model_path: str) -> str:
    """``mistral`` when the directory has params.json and no config.json, else ``hf``."""
    is_dir = os.path.isdir(model_path)
    native = is_dir and os.path.isfile(os.path.join(model_path, "params.json")) \
        and not os.path.isfile(os.path.join(model_path, "config.json"))
    return "mistral" if native else "hf"


@hookimpl
def engine_parse_model_config(model_path: str, config: Any) -> Any:
    """Delegate to the chosen parser through the process-wide registry."""
    return get_registry().create("model_config_parser", choose(model_path), model_path=model_path,
                            config=config)

"""mistral model-config parser: Mistral's native ``params.json``."""

from __future__ import annotations

import os
from typing import Any

from engine.api import ConfigError
from engine.api import models as parsing
from engine.api import hookimpl


@hookimpl
def engine_parse_model_config(model_path: str, config: Any) -> Any:
    """A directory with ``params.json`` (dim, n_layers, n_heads, n_kv_heads, head_dim...)."""
    if not os.path.isfile(os.path.join(model_path, "params.json")):
        raise ConfigError(f"--model-path {model_path}: no params.json (the mistral model-config "
                          "parser reads Mistral-native checkpoints)")
    return parsing.read_mistral_params(model_path)

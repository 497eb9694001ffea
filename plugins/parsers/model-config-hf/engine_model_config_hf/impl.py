"""hf model-config parser: ``config.json`` (transformers' AutoConfig) or GGUF metadata."""

from __future__ import annotations

import os
from typing import Any

from engine.api import ConfigError
from engine.api import models as parsing
from engine.api import hookimpl


@hookimpl
def engine_parse_model_config(model_path: str, config: Any) -> Any:
    """A ``.gguf`` file, a directory with ``config.json``, or a directory holding one ``.gguf``."""
    if os.path.isfile(model_path):
        if model_path.endswith(".gguf"):
            return parsing.read_gguf(model_path)
        raise ConfigError(f"--model-path {model_path}: a file must be a .gguf")
    if os.path.isfile(os.path.join(model_path, "config.json")):
        return parsing.read_hf_dir(model_path)
    gguf_file = parsing.gguf_in(model_path)
    if gguf_file:
        return parsing.read_gguf(gguf_file)
    raise ConfigError(f"--model-path {model_path}: no config.json and no single .gguf file")

"""The model-config family's interface (hook ``engine_parse_model_config``).

A parser turns a model path into a :class:`ModelConfig` (or ``None`` when it does not recognise
the path). The readers below are the shared machinery: a Hugging Face directory
(``config.json``), a GGUF file's metadata, a Mistral-native ``params.json``.
"""

from engine.models.config import ModelConfig
from engine.models.parsing import gguf_in, read_gguf, read_hf_dir, read_mistral_params

__all__ = ["ModelConfig", "gguf_in", "read_gguf", "read_hf_dir", "read_mistral_params"]

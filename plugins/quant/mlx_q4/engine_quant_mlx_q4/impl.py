"""``--quantization mlx_q4``: MLX affine 4-bit linears (and embeddings, dequantized at load)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import MLXMethod, PerLayer, QuantMethod, claim, mlx_dense_embeddings, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("mlx_q4", quant_config, ("mlx_q4",))
    if cfg.get("mode", "affine") != "affine":
        raise unsupported("quantization.mode", cfg.get("mode"), "affine MLX checkpoints")
    group = int(cfg.get("group_size", 64))
    return PerLayer(lambda name: MLXMethod(4, group),
                    rewrite=mlx_dense_embeddings(4, group))

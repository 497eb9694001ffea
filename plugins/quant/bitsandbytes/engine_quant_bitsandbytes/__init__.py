"""bitsandbytes (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='bitsandbytes',
    family="quantization",
    implementation="engine_quant_bitsandbytes.impl",
    description='bitsandbytes pre-quantized 4-bit checkpoints (nf4/fp4, blocks of 64, double quantization); dequantize-then-matmul',
    notes=(
        "4-bit: the code book, absmax and nested statistics are read from the checkpoint and dequantized at load (exact against the bitsandbytes library's dequantize_4bit); the library itself is not needed",
        "LLM.int8 (load_in_8bit) checkpoints and online quantization of a dense checkpoint are refused: the outlier decomposition is not reproduced",
    ),
)

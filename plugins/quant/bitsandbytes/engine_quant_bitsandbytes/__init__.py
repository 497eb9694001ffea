"""bitsandbytes (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='bitsandbytes',
    family="quantization",
    implementation="engine_quant_bitsandbytes.impl",
    description='bitsandbytes pre-quantized checkpoints: 4-bit (nf4/fp4, blocks of 64, double quantization; dequantize-then-matmul) and LLM.int8 (int8 products with float outlier columns)',
    notes=(
        "4-bit: the code book, absmax and nested statistics are read from the checkpoint and dequantized at load (exact against the bitsandbytes library's dequantize_4bit); the library itself is not needed",
        "LLM.int8 (load_in_8bit): int8 weights with SCB; activations quantized per row to int8 at each call, the columns with an outlier (|x| >= llm_int8_threshold) multiplied in full precision against the dequantized weight columns, as bitsandbytes' reference operators do (bit for bit on CPU); the library itself is not needed",
        "online quantization of a dense checkpoint is refused",
    ),
)

"""compressed-tensors (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='compressed-tensors',
    family="quantization",
    implementation="engine_quant_compressed_tensors.impl",
    description='compressed-tensors checkpoints: W8A8 int8, W8A8 fp8 (tensor/channel/block, dynamic or static), W8A16 int8, W4A16/W8A16 pack-quantized (group, channel, asym, actorder)',
    notes=(
        'int W8A8: exact int32 products; fp8: fp8 activations emulated on CPU, torch._scaled_mm on CUDA; weight-only: dequantized at load',
        'nvfp4/mxfp4-pack-quantized linears, 2:4 sparsity and transforms are refused with the field',
    ),
)

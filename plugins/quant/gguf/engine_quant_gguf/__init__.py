"""gguf quantization: manifest only (the kernels compile and load on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="gguf",
    family="quantization",
    implementation="engine_quant_gguf.impl",
    description="GGUF Q4_0/Q4_1/Q8_0 and K-quant (Q2_K/Q3_K/Q4_K/Q5_K/Q6_K) weights kept packed; "
                "AVX2/VNNI matmuls read the blocks directly (int8 activations, or exact float32 "
                "ones for Q4_0/Q4_1/Q8_0)",
    requires=Requires(packages=("gguf",), devices=("cpu", "cuda"),
                      cpu_features=("avx2", "fma", "f16c"), executables=("cc",)),
    options=(
        Option("--gguf-activations", choices=("int8", "float32"), default="int8",
               help="int8: activations quantized per block of 32, integer dot products "
                    "(llama.cpp's arithmetic, fastest); float32: exact products of the "
                    "dequantized weights (equal to the dense model up to summation order). "
                    "K-quant layers quantize activations per 256 values to 8 bits either way."),
        Option("--gguf-kernel-max-rows", type="int", default=64,
               help="With --gguf-activations float32: largest token count whose matmuls read "
                    "the packed blocks; larger batches (long prefills) multiply a dequantized "
                    "copy made for the call."),
    ),
    notes=("selected by default for a .gguf checkpoint served on CPU",
           "on a CUDA GPU every block type is dequantized at load to the model dtype (no packed "
           "GPU kernel in this build)",
           "the kernels compile with the system C compiler on first use (cached)"),
)

"""gguf quantization: manifest only (the kernels compile and load on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="gguf",
    family="quantization",
    implementation="engine_quant_gguf.impl",
    description="GGUF Q4_0/Q4_1/Q8_0 and K-quant (Q2_K/Q3_K/Q4_K/Q5_K/Q6_K) weights kept packed; "
                "AVX2/VNNI matmuls read the blocks directly (float32 activations; 8-bit "
                "activations for K-quants), dense weights for large batches",
    requires=Requires(packages=("gguf",), devices=("cpu",),
                      cpu_features=("avx2", "fma", "f16c"), executables=("cc",)),
    options=(
        Option("--gguf-kernel-max-rows", type="int", default=64,
               help="Largest token count whose matmuls read the packed blocks; larger batches "
                    "(long prefills) use the dequantized copy."),
    ),
    notes=("selected by default for a .gguf checkpoint served on CPU",
           "the kernels compile with the system C compiler on first use (cached)"),
)

"""humming (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='humming',
    family='moe',
    implementation=None,
    description='humming-kernels JIT GEMMs for low-bit expert weights',
    requires=Requires(packages=('humming-kernels',),
                      devices=('cuda',),
                      min_compute_capability=(7, 5)),
    not_implemented=(
        "multiplies only quantized (<= 8-bit) weights, and the expert runners of this build "
        "receive every routed expert dense (quantization methods hand their experts over "
        "dequantized), so there is nothing for it to serve; its dense-layer GEMMs run on the "
        "H200 as --quantization humming"
    ),
)

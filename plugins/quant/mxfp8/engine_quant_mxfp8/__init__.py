"""mxfp8 (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin

plugin = Plugin(
    name='mxfp8',
    family="quantization",
    implementation=None,
    description='MXFP8: e4m3 weights with UE8M0 scales per 32, dynamic MXFP8 activations',
    not_implemented='needs MX tensor cores (SM100 or newer, FlashInfer/CUTLASS); this build has no emulated MXFP8 path yet',
)

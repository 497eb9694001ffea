"""quark_mxfp4 (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='quark_mxfp4',
    family="quantization",
    implementation=None,
    description='online MXFP4 W4A4 requantization',
    requires=Requires(devices=('rocm',)),
    not_implemented='needs an AMD gfx950 GPU (aiter MXFP4 kernels); no emulated path in this build',
)

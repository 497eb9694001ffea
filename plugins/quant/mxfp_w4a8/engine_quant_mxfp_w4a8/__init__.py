"""mxfp_w4a8 (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='mxfp_w4a8',
    family="quantization",
    implementation=None,
    description='MXFP4 weights with MXFP8 activations',
    requires=Requires(packages=('torch_npu',), devices=('npu',)),
    not_implemented='needs an Ascend A5 NPU (torch_npu); no emulated path in this build',
)

"""modelslim (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='modelslim',
    family="quantization",
    implementation=None,
    description='Ascend msModelSlim checkpoints (quant_model_description.json)',
    requires=Requires(packages=('torch_npu',), devices=('npu',)),
    not_implemented='needs an Ascend NPU with torch_npu and CANN kernels; no emulated path in this build',
)

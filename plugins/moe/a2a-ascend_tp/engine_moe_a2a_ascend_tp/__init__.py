"""ascend_tp (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='ascend_tp',
    family='moe_a2a',
    implementation=None,
    description='Ascend tensor-parallel experts',
    requires=Requires(packages=('torch_npu',),
                      devices=('npu',)),
    not_implemented=(
        'needs torch_npu and an Ascend NPU'
    ),
)

"""ascend_fuseep (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='ascend_fuseep',
    family='moe_a2a',
    implementation=None,
    description='Ascend fused expert parallelism',
    requires=Requires(packages=('torch_npu',),
                      devices=('npu',)),
    not_implemented=(
        'needs torch_npu and several Ascend NPUs'
    ),
)

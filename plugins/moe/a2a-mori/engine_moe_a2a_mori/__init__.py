"""mori (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='mori',
    family='moe_a2a',
    implementation=None,
    description='AMD MORI-EP',
    requires=Requires(packages=('amd-mori',),
                      devices=('rocm',)),
    not_implemented=(
        'needs several ROCm GPUs (--ep-size > 1) and amd-mori'
    ),
)

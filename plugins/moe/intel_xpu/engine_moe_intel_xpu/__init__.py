"""intel_xpu (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='intel_xpu',
    family='moe',
    implementation=None,
    description='Intel XPU fused MoE kernels',
    requires=Requires(packages=('sglang-kernel-xpu',),
                      devices=('xpu',)),
    not_implemented=(
        'needs an Intel data-center GPU and the XPU kernel package'
    ),
)

"""intel_xpu attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="intel_xpu",
    family="attention",
    implementation=None,
    description="Intel GPU (XPU) attention kernels",
    requires=Requires(devices=("xpu",)),
    not_implemented=(
        "needs an Intel GPU with XMX (torch built for XPU, with its attention kernels), page "
        "size 64 or 128; no adapter in this build"
    ),
)

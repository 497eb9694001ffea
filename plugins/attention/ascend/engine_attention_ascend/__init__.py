"""ascend attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="ascend",
    family="attention",
    implementation=None,
    description="Huawei Ascend NPU attention",
    requires=Requires(packages=("torch_npu",),
                      devices=("npu",)),
    not_implemented=(
        "needs torch_npu and an Ascend NPU (native page size 128); no adapter in this build"
    ),
)

"""compressed attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="compressed",
    family="attention",
    implementation=None,
    description="Deprecated alias of dsv4 (DeepSeek-V4 compressed attention)",
    requires=Requires(packages=("flash-mla",),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(10, 3),
                      model_features=("deepseek_v4_attention",)),
    not_implemented=(
        "alias of dsv4: needs a DeepSeek-V4 model and FlashMLA sparse kernels on SM90/SM100; "
        "no adapter in this build"
    ),
)

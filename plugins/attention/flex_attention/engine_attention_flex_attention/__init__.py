"""flex_attention attention: manifest only (the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="flex_attention",
    family="attention",
    implementation="engine_attention_flex_attention.impl",
    description="torch flex_attention over the batch's pages gathered through req_to_token, "
                "with a per-request causal block mask",
    requires=Requires(packages=("torch>=2.5",), devices=("cpu", "cuda")),
    priority=5,  # below torch_native: on CPU flex runs eagerly and unfused; on GPU triton and flashinfer rank higher
    notes=("CUDA: flex_attention compiled (first batches pay the compile); CPU: flex's eager "
           "path, which materializes the scores of the whole batch",),
)

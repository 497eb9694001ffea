"""torch_native attention: the reference backend (manifest only; the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="torch_native",
    family="attention",
    implementation="engine_attention_torch_native.impl",
    description="Reference paged attention in PyTorch: gathers each request's pages and runs SDPA",
    requires=Requires(packages=("torch",), devices=("cpu", "cuda")),
    priority=10,
)

"""torch MoE runner: manifest only (the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="torch",
    family="moe",
    implementation="engine_moe_torch.impl",
    description="PyTorch grouped GEMMs over the tokens sorted by expert (the CPU runner and the "
                "reference the others are checked against)",
    requires=Requires(devices=("cpu", "cuda")),
    priority=10,
    notes=("torch.nn.functional.grouped_mm where this torch has it for the device and dtype, "
           "else one matmul per expert that received tokens",),
)

"""UNO speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="uno",
    family="speculative",
    implementation="engine_spec_uno.impl",
    description="UNO: the target itself, with a draft-only LoRA adapter on the rows after "
                "the last token, drafts a block in one forward from random noise tokens; "
                "verified as a chain",
    requires=Requires(packages=("safetensors",), devices=("cpu", "cuda")),
    options=(
        Option("--uno-lora-path", type="str", default=None,
               help="Path to the UNO draft LoRA checkpoint (a PEFT adapter of the target: "
                    "adapter_config.json and adapter_model.safetensors)."),
    ),
)

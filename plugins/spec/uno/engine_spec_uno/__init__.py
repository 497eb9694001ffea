"""uno (speculative): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="uno",
    family="speculative",
    implementation=None,
    description="UNO speculative decoding: the target itself with a draft-only LoRA adapter drafts from mask tokens",
    requires=Requires(devices=("cpu", "cuda")),
    not_implemented=(
        "needs LoRA adapters on the target (not built in this engine: --enable-lora and --uno-lora-path are refused) to run the draft pass, and the adapter's mask-token id; its draft is a second forward of the target with the adapter applied"
    ),
)

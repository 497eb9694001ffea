"""experimental_sgl_trtllm (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='experimental_sgl_trtllm',
    family='moe',
    implementation=None,
    description='TRT-LLM MoE sources overlaid for MoE-LoRA',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        "needs SM100 (Blackwell) and SGLang's overlay of the TRT-LLM MoE sources; no adapter in this build"
    ),
)

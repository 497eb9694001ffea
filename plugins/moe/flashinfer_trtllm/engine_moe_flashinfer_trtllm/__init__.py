"""flashinfer_trtllm (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_trtllm',
    family='moe',
    implementation=None,
    description='FlashInfer TRT-LLM-gen fused MoE',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        "needs SM100 (Blackwell): FlashInfer's TRT-LLM-gen MoE kernels have no SM90 build"
    ),
)

"""flashinfer_trtllm_routed (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_trtllm_routed',
    family='moe',
    implementation=None,
    description='FlashInfer TRT-LLM-gen MoE with routing computed by the engine',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        'needs SM100 (Blackwell): TRT-LLM-gen kernels'
    ),
)

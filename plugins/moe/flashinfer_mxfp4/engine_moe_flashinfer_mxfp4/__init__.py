"""flashinfer_mxfp4 (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_mxfp4',
    family='moe',
    implementation=None,
    description='FlashInfer TRT-LLM-gen MXFP4 MoE (GPT-OSS)',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        'needs SM100 (Blackwell) and MXFP4 expert weights'
    ),
)

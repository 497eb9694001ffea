"""flashinfer_megamoe (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_megamoe',
    family='moe',
    implementation=None,
    description='flashinfer.megamoe: SM90 W4A8 expert-parallel MegaMoE',
    requires=Requires(packages=('flashinfer-python>=0.7',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        'needs FlashInfer 0.7 (flashinfer.megamoe), several NVLink-connected Hopper GPUs with data-parallel attention, and MXFP4/NVFP4 expert weights'
    ),
)

"""llada2_cfg_flashinfer attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="llada2_cfg_flashinfer",
    family="attention",
    implementation=None,
    description="FlashInfer attention for LLaDA2 diffusion LMs with classifier-free guidance",
    requires=Requires(packages=("flashinfer-python",),
                      devices=("cuda",),
                      min_compute_capability=(8, 0),
                      model_features=("diffusion_lm",)),
    not_implemented=(
        "needs a LLaDA2 diffusion language model (bidirectional block decoding with "
        "classifier-free guidance) and flashinfer-python on a CUDA GPU; not for MLA models; "
        "no adapter in this build"
    ),
)

"""triton MoE runner: manifest only (the kernels load on selection).

The manifest states the production truth: a CUDA GPU (SM80+ for bfloat16) with triton. On a CPU
the same kernels run under Triton's interpreter (``TRITON_INTERPRET=1``) for tests, reached by
calling the hook directly (conformance kit, tests); the hook refuses a CPU without it.
"""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="triton",
    family="moe",
    implementation="engine_moe_triton.impl",
    description="own fused MoE in Triton: tokens aligned by expert into blocks, grouped GEMMs "
                "over the sorted rows (gate+up fused), SiLU-and-mul, down projection weighted by "
                "the router, combine",
    requires=Requires(packages=("triton",), devices=("cuda",), min_compute_capability=(8, 0)),
    priority=30,
    options=(
        Option("--triton-moe-config-dir", type="str", default=None,
               help="Directory of tuned launch tables (JSON, see benchmarks/tune_moe_triton.py) "
                    "searched before the plugin's own."),
    ),
    notes=("CPU: runs only under TRITON_INTERPRET=1 (slow; for tests), built through the hook",
           "serves float32, bfloat16 and float16 expert weights"),
)

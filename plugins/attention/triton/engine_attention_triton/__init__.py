"""triton attention: manifest only (the kernels load on selection).

The manifest states the production truth: a CUDA GPU (SM80+ for bfloat16) with triton installed.
On a CPU the same kernels run under Triton's interpreter (``TRITON_INTERPRET=1``) for tests; that
mode is reached by calling the hook directly (conformance kit, tests, benchmarks' CPU smoke run),
where the hook itself refuses a CPU pool without the interpreter. ``Requires`` has no environment
check, and a manifest computed from the environment would be frozen by the discovery cache.
"""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="triton",
    family="attention",
    implementation="engine_attention_triton.impl",
    description="Triton kernels reading the paged pool: split-KV GQA decode + LSE merge, "
                "tiled causal extend over the cached prefix",
    requires=Requires(packages=("triton",), devices=("cuda",), min_compute_capability=(8, 0)),
    priority=40,  # auto on CUDA: decode in CUDA graphs (docs/benchmarks/attention-h200.md)
    options=(
        Option("--triton-attention-num-kv-splits", type="int", default=8,
               help="KV splits per request in the decode kernel (more helps long contexts)."),
        Option("--triton-attention-split-tile-size", type="int", default=None,
               help="Fixed tokens per decode split (splits then depend only on the request's "
                    "length: batch-invariant, deterministic); overrides the split count."),
        Option("--triton-attention-reduce-in-fp32", type="bool", default=False,
               help="Keep the decode kernel's partial outputs in float32 before the merge."),
    ),
    notes=("CPU: runs only under TRITON_INTERPRET=1 (slow; for tests), built through the hook",),
)

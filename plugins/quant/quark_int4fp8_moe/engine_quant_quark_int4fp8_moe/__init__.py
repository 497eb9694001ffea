"""quark_int4fp8_moe (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='quark_int4fp8_moe',
    family="quantization",
    implementation=None,
    description='online int4 MoE experts upcast to fp8, fp8 linears',
    requires=Requires(devices=('rocm',)),
    not_implemented='AMD CDNA3/CDNA4 GPUs only (ROCm, aiter) and MoE-only: routed experts are served now but not quantized in this build',
)

"""humming (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='humming',
    family="quantization",
    implementation=None,
    description='humming-kernels JIT mixed-precision GEMM backend over gptq/awq/compressed-tensors/modelopt checkpoints',
    requires=Requires(packages=('humming-kernels',), devices=('cuda',)),
    not_implemented='needs the humming-kernels package and a CUDA GPU with nvcc; the same checkpoints run through gptq, awq, compressed-tensors and modelopt here',
)

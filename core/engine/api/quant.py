"""The quantization family's interface (hook ``engine_create_quant_method``).

A :class:`QuantMethod` decides per layer (``for_layer(name)``) how a :class:`Linear` stores its
weight (``create_weights``), repacks it once loaded (``process_weights_after_loading``) and
computes ``x @ W.T + bias`` (``apply``). Block-quantized checkpoint tensors reach a parameter's
``weight_loader`` as :class:`PackedWeight`; :class:`UnquantizedMethod` is the dense method. A
method whose rows never depend on each other says ``batch_invariant`` (the core otherwise
multiplies row by row under ``--enable-deterministic-inference``; :func:`rowwise` does that).

The shared machinery of the checkpoint formats: ``formats`` (bit packing, dequantizers and
activation quantizers: :mod:`engine.runtime.quant_formats`), :func:`add_param` (a checkpoint
tensor whose loader places fused shards by output rows and checks shapes),
:class:`DequantizedMethod` (weight-only formats), :class:`Fp8Method`, the MX formats
(:class:`MXFP8Method`, :class:`MXFP4Method`), :class:`Int8Method`, :class:`OnlineExperts` (formats that quantize routed experts only,
emulated; :data:`EXPERTS` matches their layer names), :func:`claim` (does a
choice read this checkpoint: conflicts and missing configs as one-line errors), :func:`is_excluded` (a checkpoint's ignore lists against a possibly fused layer).
"""

from engine.models.parsing import release_pages
from engine.runtime import quant_formats as formats
from engine.runtime.linear import (Linear, NativeKernel, PackedWeight, QuantMethod,
                                   UnquantizedMethod, cpu_half_weight, dense_linear,
                                   dense_native_kernel, rowwise)
from engine.runtime.quant_readers import (MXFP4_DTYPES, awq_method, compressed_tensors_scheme, fp8_method,
                                          gptq_exclusions, gptq_method, modelopt_scheme,
                                          quark_scheme)
from engine.runtime.quant_schemes import (AWQMethod, BnB4bitMethod, BnB8bitMethod, GPTQMethod, IntWeightOnlyMethod, MLXMethod,
                                          NVFP4WeightMethod, PackQuantizedMethod, PerLayer,
                                          W4AFp8ExpertMethod, ModelSlimDynamicMethod,
                                          ModelSlimW8A8Method,
                                          bnb_rewrite, excluding, mlx_dense_embeddings)
from engine.runtime.quant_methods import (EXPERTS, DequantizedMethod, Fp8Method, Int8Method,
                                          LayerMethod, MXFP4Method, MXFP8Method, MXMethod,
                                          OnlineExperts, fake_quant_fp8_rows,
                                          fake_quant_nvfp4_rows,
                                          add_param, check_group, checkpoint_names, claim,
                                          drop_checkpoint_params,
                                          config_value, is_excluded, packed_extent, unsupported)

__all__ = ["fake_quant_fp8_rows", "fake_quant_nvfp4_rows", "ModelSlimDynamicMethod", "ModelSlimW8A8Method", "W4AFp8ExpertMethod", "EXPERTS", "OnlineExperts", "MXFP4_DTYPES", "AWQMethod", "BnB4bitMethod", "BnB8bitMethod", "bnb_rewrite", "GPTQMethod", "IntWeightOnlyMethod", "MLXMethod", "NVFP4WeightMethod",
           "PackQuantizedMethod", "PerLayer", "awq_method", "compressed_tensors_scheme",
           "excluding", "fp8_method", "gptq_exclusions", "gptq_method", "mlx_dense_embeddings", "modelopt_scheme",
           "quark_scheme", "DequantizedMethod", "Fp8Method", "Int8Method", "LayerMethod", "Linear",
           "MXFP4Method", "MXFP8Method", "MXMethod",
           "NativeKernel", "PackedWeight", "QuantMethod", "UnquantizedMethod", "add_param",
           "check_group",
           "checkpoint_names", "claim", "config_value", "cpu_half_weight", "dense_linear",
           "dense_native_kernel", "drop_checkpoint_params",
           "formats", "is_excluded",
           "packed_extent", "release_pages", "rowwise", "unsupported"]

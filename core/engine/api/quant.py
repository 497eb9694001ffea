"""The quantization family's interface (hook ``engine_create_quant_method``).

A :class:`QuantMethod` decides per layer (``for_layer(name)``) how a :class:`Linear` stores its
weight (``create_weights``), repacks it once loaded (``process_weights_after_loading``) and
computes ``x @ W.T + bias`` (``apply``). Block-quantized checkpoint tensors reach a parameter's
``weight_loader`` as :class:`PackedWeight`; :class:`UnquantizedMethod` is the dense method. A
method whose rows never depend on each other says ``batch_invariant`` (the core otherwise
multiplies row by row under ``--enable-deterministic-inference``; :func:`rowwise` does that).
"""

from engine.runtime.linear import Linear, PackedWeight, QuantMethod, UnquantizedMethod, rowwise

__all__ = ["Linear", "PackedWeight", "QuantMethod", "UnquantizedMethod", "rowwise"]

"""Triton helpers for plugins' kernels (imported by a plugin's kernel module only: a CPU server
never loads Triton).

``fp8_from_bits(x, FP8)``: fp8 tensors travel to kernels as their uint8 bit patterns (so masked
loads can fill zeros, which Triton cannot cast to fp8); this turns loaded bits back into the fp8
type ``FP8`` names (1: e4m3, 2: e5m2; 0: ``x`` unchanged). ``fp8_kind(dtype)`` is that flag for a
torch dtype.
"""

from engine.runtime.quant_triton import fp8_from_bits, fp8_kind

__all__ = ["fp8_from_bits", "fp8_kind"]

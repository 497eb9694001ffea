"""The ``fp4_mx_block16`` KV-cache format: 4-bit E2M1 values with one power-of-two scale per 16.

A row of ``D`` values (one head of one token; ``D`` a multiple of 16) is stored as ``D / 2 + D /
16`` bytes: first the codes, two a byte (element ``2i`` in the low nibble, ``2i + 1`` in the
high one), then one scale byte per block of 16 consecutive elements.

- A block's scale is ``2^e`` with ``e = ceil(log2(max(amax / 6, 1e-10)))`` (``amax`` the
  block's largest magnitude, 6 the largest E2M1 value), stored as the byte ``e + 127``.
- Each value ``x / 2^e`` becomes the E2M1 code of sign bit 8 (set for negative values) and the
  magnitude index of the largest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 whose rounding bound (0.25, 0.75,
  1.25, 1.75, 2.5, 3.5, 5) the magnitude reaches: a magnitude on a bound rounds up.
- Reading multiplies the code's value by ``2^(byte - 127)``, exactly.
"""

from __future__ import annotations

import torch

#: E2M1 magnitudes by index (the code's low three bits)
VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: the magnitude at or above which a scaled value takes the next index
BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
BLOCK = 16


def row_bytes(head_dim: int) -> int:
    """Bytes a row of ``head_dim`` values takes."""
    return head_dim // 2 + head_dim // BLOCK


def pack(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] -> uint8 [..., D / 2 + D / 16] (codes, then the blocks' scale bytes)."""
    *lead, d = x.shape
    blocks = x.to(torch.float32).reshape(*lead, d // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(torch.clamp(amax / VALUES[-1], min=1e-10)))
    scaled = blocks / torch.exp2(e)
    # the index is the number of bounds the magnitude reaches (no host tensor: this runs inside
    # CUDA graph captures, where a copy from the host is not allowed)
    magnitude = scaled.abs()
    codes = torch.zeros_like(magnitude, dtype=torch.uint8)
    for bound in BOUNDS:
        codes += magnitude >= bound
    codes = (codes | ((scaled < 0).to(torch.uint8) << 3)).reshape(*lead, d)
    data = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return torch.cat([data, (e.squeeze(-1) + 127).to(torch.uint8)], -1)


def unpack(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``rows`` [..., D / 2 + D / 16] -> their values [..., D] as ``dtype``."""
    *lead, _ = rows.shape
    data, scales = rows[..., :head_dim // 2], rows[..., head_dim // 2:]
    codes = torch.stack([data & 15, data >> 4], -1).reshape(*lead, head_dim)
    # E2M1 by its bits (no host table, as in pack): exponent field e, mantissa bit m;
    # 0.5 m when e == 0, else (1 + m / 2) 2^(e - 1)
    e, m = ((codes >> 1) & 3).to(torch.float32), (codes & 1).to(torch.float32)
    values = torch.where(e == 0, 0.5 * m, (1 + 0.5 * m) * torch.exp2(e - 1))
    values = torch.where((codes & 8) != 0, -values, values)
    scale = torch.exp2(scales.to(torch.float32) - 127)
    out = values.reshape(*lead, head_dim // BLOCK, BLOCK) * scale[..., None]
    return out.reshape(*lead, head_dim).to(dtype)

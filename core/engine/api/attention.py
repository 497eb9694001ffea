"""The attention family's interface (hook ``engine_create_attention_backend``).

A backend is built once per model runner from the paged :class:`KVPool`. Per forward the runner
calls ``prepare(batch)`` once, then ``forward(q, k, v, layer, batch)`` for every layer: write the
new tokens' K/V into the pool at ``batch.out_cache_loc`` and return the attention output
(``q`` [T, Hq, D], ``k``/``v`` [T, Hkv, D], output [T, Hq, D]). New token ``j`` of request ``i``
(position ``prefix_lens[i] + j``) attends to every cached token of that request and to new tokens
``0..j``. A backend never hands work to another backend; ``supports_cuda_graph`` says whether its
decode path may be captured, ``supports_tree_verify`` whether it honours a speculative tree's
``batch.tree_mask``, ``supports_verify_graph`` whether its verify forwards may be captured
(``prepare_verify_graph``: rows of one width, metadata from the shape), ``batch_invariant``
whether a token's output is independent of the rest of the batch
(``--enable-deterministic-inference``; :func:`attend_per_token` is such a path),
``supports_fp8_kv_cache`` / ``supports_fp4_kv_cache`` whether it reads a pool of fp8 values
with per-layer scales / of ``fp4_mx_block16`` rows (``KVPool.gather`` unpacks both). :func:`attend_from_pool` / :func:`decode_from_pool` are the core's CPU kernel over a
float32 pool (each token alone: batch- and prefill/decode-invariant). :mod:`engine.testing.attention` is the conformance suite.
``attend_codes(q, layer, batch, fmt)`` may write the output as the next layer's fp8 group
codes (:class:`GroupCodes`) where the backend's kernel makes them; the default declines.
"""

from engine.runtime.attention import (AttentionBackend, AttentionLayerSpec, KVPool,
                                      attend_from_pool, attend_per_token, decode_from_pool,
                                      pool_attention_applies)
from engine.runtime.batch import Batch, ForwardMode, to_device
from engine.runtime.linear import GroupCodes

__all__ = ["AttentionBackend", "AttentionLayerSpec", "Batch", "ForwardMode", "GroupCodes",
           "KVPool", "attend_from_pool", "attend_per_token", "decode_from_pool",
           "pool_attention_applies", "to_device"]

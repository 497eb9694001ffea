"""The attention conformance kit over torch_native, built through the plugin registry."""

from __future__ import annotations

import torch

from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.plugins.registry import Registry
from engine.testing.attention import check


def test_torch_native_conforms():
    registry = Registry()
    record = registry.resolve("attention", "torch_native")

    def make_backend(**kwargs):
        return Assembly(ServerConfig(), registry).build(record, **kwargs)

    failures = check("torch_native", make_backend, device="cpu")
    assert failures == [], "\n".join(failures[:20])


def test_kit_catches_a_backend_that_ignores_causality():
    from engine_attention_torch_native.impl import PoolTokens, TorchNativeBackend

    class NotCausal(TorchNativeBackend):
        def prepare(self, batch):
            super().prepare(batch)
            md = batch.attn_metadata
            if md is None:  # CPU decode reads the pool directly: no mask to break
                return
            if isinstance(md, PoolTokens):  # every new token sees its request's last key
                seq = torch.repeat_interleave(batch.seq_lens,
                                              torch.tensor(batch.extend_lens_cpu))
                md.lens = seq
                return
            md.is_causal = False
            if md.mask is not None and not batch.is_decode:
                md.mask = md.mask | True

    failures = check("not_causal", lambda pool, model_config, config: NotCausal(pool), "cpu")
    assert failures and all("differs from the reference" in f or "non-finite" in f
                            for f in failures)


def test_torch_native_batch_invariant_path_conforms():
    """Its --enable-deterministic-inference path (one SDPA call per token) is still correct
    attention: ragged batches, cached prefixes, decode, page sizes, GQA."""
    registry = Registry()
    record = registry.resolve("attention", "torch_native")

    def make_backend(pool, model_config, config):
        backend = Assembly(ServerConfig(), registry).build(
            record, pool=pool, model_config=model_config,
            config=config.replace(enable_deterministic_inference=True))
        assert backend.batch_invariant
        return backend

    failures = check("torch_native", make_backend, device="cpu")
    assert failures == [], "\n".join(failures[:20])


def test_kit_catches_a_tree_verify_backend_that_ignores_the_tree_mask():
    from engine_attention_torch_native.impl import TorchNativeBackend

    class NoTree(TorchNativeBackend):
        def prepare(self, batch):
            batch.tree_mask = None  # claims tree verify, attends causally instead
            super().prepare(batch)

    failures = check("no_tree", lambda pool, model_config, config: NoTree(pool), "cpu")
    assert failures and all(" verify: " in f for f in failures)

"""flex_attention plugin: the conformance kit on CPU (flex's eager path) through the registry,
and on CUDA (compiled) when a GPU is present."""

from __future__ import annotations

import pytest

from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.plugins.registry import Registry
from engine.testing import attention as kit


def test_kit_on_cpu_through_the_registry():
    registry = Registry()
    record = registry.resolve("attention", "flex_attention")

    def make_backend(**kwargs):
        return Assembly(ServerConfig(), registry).build(record, **kwargs)

    failures = kit.check("flex_attention", make_backend, device="cpu")
    assert failures == [], "\n".join(failures[:20])


@pytest.mark.gpu
def test_kit_on_cuda():
    from engine_attention_flex_attention.impl import engine_create_attention_backend

    failures = kit.check("flex_attention", engine_create_attention_backend, device="cuda")
    assert failures == [], "\n".join(failures[:20])

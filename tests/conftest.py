"""Shared test set-up: a private plugin-discovery cache, and markers."""

import os
import tempfile

import pytest

os.environ.setdefault("ENGINE_CACHE_DIR", tempfile.mkdtemp(prefix="engine-test-cache-"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)

"""Shared test set-up: a private plugin-discovery cache, markers, and a fixed random state at
the start of every test."""

import os
import random
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


@pytest.fixture(autouse=True)
def _same_random_state():
    """Every test starts from the same random state (torch, numpy, random), whatever ran
    before it: a test's draws do not depend on the order or selection of tests."""
    random.seed(0)
    try:
        import numpy as np
        import torch
    except ImportError:
        return
    np.random.seed(0)
    torch.manual_seed(0)

"""Block fp8 products' inputs written as group codes by the norm and SiLU-and-mul kernels
before them (no quantization launch between): the kernels' codes equal ``quant_groups``' of the
plain kernels' rows bit for bit, the product from them equals the product that makes them, and
a tiny block fp8 Llama's logits are unchanged (``group_codes_checks.py``): under the Triton
interpreter here, on the GPU where there is one."""

import os

import pytest

from child_checks import run_checks

CHECKS = os.path.join(os.path.dirname(__file__), "group_codes_checks.py")


def test_group_codes_made_before_the_product_under_the_interpreter():
    assert run_checks(CHECKS, "cpu", env={"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_group_codes_made_before_the_product_on_the_gpu():
    assert run_checks(CHECKS, "cuda") == []

"""Every ``--quantization`` choice is packaged: real ones pass the quantization conformance kit
on the checkpoint kinds they read, emulated ones say so, the rest are refused with a reason."""

from __future__ import annotations

import pytest
import torch

from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.plugins.registry import Registry
from engine.testing import quant as tq

CHOICES = ("awq fp8 mxfp8 gptq gptq_marlin awq_marlin bitsandbytes gguf modelopt modelopt_fp8 "
           "modelopt_fp4 nvfp4_online modelopt_mixed petit_nvfp4 w8a8_int8 w8a8_fp8 moe_wna16 "
           "w4afp8 mxfp4 auto-round auto-round-int8 compressed-tensors modelslim mxfp_w4a8 quark "
           "quark_int4fp8_moe quark_mxfp4 mlx_q4 mlx_q8 unquant humming").split()
EMULATED = {"gptq_marlin", "awq_marlin", "modelopt_fp4", "petit_nvfp4", "modelopt_mixed",
            "mxfp8", "quark_mxfp4", "mxfp_w4a8", "quark_int4fp8_moe", "nvfp4_online", "w4afp8", "mxfp4", "modelslim"}
#: choice -> kit schemes it must read
READS = {"gptq": {"gptq"}, "gptq_marlin": {"gptq"}, "awq": {"awq"}, "awq_marlin": {"awq"},
         "auto-round": {"auto_round"}, "moe_wna16": {"gptq", "awq"},
         "compressed-tensors": {"ct_wna16", "ct_w8a16", "ct_w8a8_int8", "ct_fp8_dynamic",
                                "ct_fp8_static", "ct_fp8_block"},
         "w8a8_int8": {"ct_w8a8_int8"}, "auto-round-int8": {"ct_w8a8_int8"},
         "w8a8_fp8": {"ct_fp8_dynamic", "ct_fp8_static", "ct_fp8_block"},
         "fp8": {"fp8_block", "fp8_tensor"},
         "modelopt": {"modelopt_fp8", "modelopt_nvfp4", "modelopt_mxfp8"},
         "mxfp8": {"mxfp8", "modelopt_mxfp8"},
         "modelopt_fp8": {"modelopt_fp8"}, "modelopt_fp4": {"modelopt_nvfp4"},
         "petit_nvfp4": {"modelopt_nvfp4"}, "quark": {"quark_fp8", "quark_mxfp4"},
         "quark_mxfp4": {"quark_mxfp4"}, "mlx_q4": {"mlx4"},
         "mlx_q8": {"mlx8"}, "bitsandbytes": {"bnb_nf4", "bnb_int8"},
         "modelslim": {"modelslim_w8a8", "modelslim_w8a8_dynamic", "modelslim_w4a4"}}


@pytest.fixture(scope="module")
def registry():
    return Registry()


def test_all_31_choices_are_listed_with_a_status(registry):
    records = {r.name: r for r in registry.family_records("quantization")}
    assert set(CHOICES) <= set(records), set(CHOICES) - set(records)
    for name in CHOICES:
        rec = records[name]
        emulated = any(n.startswith("emulated") for n in rec.manifest.notes)
        assert rec.emulated == emulated and ("(emulated)" in rec.status_line()) == emulated
        if name in READS or name in ("gguf", "unquant", "modelopt_mixed", "mxfp_w4a8",
                                     "quark_int4fp8_moe", "nvfp4_online", "w4afp8",
                                     "mxfp4"):
            assert rec.available, (name, rec.reason)
        else:
            assert not rec.available and len(rec.reason) > 30, (name, rec.reason)
        assert (name in EMULATED) == emulated, name


@pytest.mark.parametrize("choice", sorted(READS))
def test_conformance_kit_passes_on_the_kinds_each_choice_reads(registry, choice):
    rec = registry.resolve("quantization", choice, flag="--quantization")
    assembly = Assembly(ServerConfig(), registry)
    seen = set()

    def build(**kw):
        product = assembly.build(rec, **kw)
        seen.add(kw["quant_config"].get("quant_method") and _scheme_of(kw["quant_config"]))
        return product

    assert tq.check(choice, build) == []
    assert READS[choice] <= seen, READS[choice] - seen


def _scheme_of(qcfg):
    """The kit scheme a config was written for (a description of tensors aside)."""
    def bare(cfg):
        return {k: v for k, v in cfg.items() if k != "description"}
    for scheme, kw in tq.KIT_SCHEMES.items():
        _, cfg, _ = tq.quantize_state({}, scheme, **kw)
        if bare(tq.normalized_config(scheme, cfg)) == bare(qcfg):
            return scheme
    return None


def test_unquant_refuses_a_checkpoint_of_another_format(registry):
    rec = registry.resolve("quantization", "unquant", flag="--quantization")
    with pytest.raises(ConfigError, match="unquant conflicts .*'gptq'"):
        Assembly(ServerConfig(), registry).build(
            rec, quant_config={"quant_method": "gptq"}, config=ServerConfig(), model_config=None,
            device=torch.device("cpu"))

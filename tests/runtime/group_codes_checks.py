"""Block fp8 inputs written as group codes by the kernels before the product: ``quant_groups``
against the torch quantizer; the norm and the
SiLU-and-mul kernels that write fp8 codes and scales per 128 columns
(engine.runtime.fused_triton.add_rms_norm_groups / silu_and_mul_groups) against the plain
kernels followed by quant_triton.quant_groups, bit for bit; the swapped product from codes
made before it (act "group_codes") against the product that makes them itself; and a tiny
block fp8 Llama decoding with them (ENGINE_PRODUCER_CODES=1; with the triton attention
backend and ENGINE_TRITON_OUTPUT_CODES=1 its merge kernel writing the output projection's codes
too) against the same model without,
logits equal: run under TRITON_INTERPRET=1 on a CPU, or on a GPU. Prints one JSON list of
failures."""

import json
import os
import sys
import tempfile

import torch

from engine.runtime import fused_triton
from engine.runtime import quant_triton as qt
from engine.runtime import swap_triton as st

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
failures: list[str] = []
gen = torch.Generator().manual_seed(0)
#: half-precision types whose products the interpreter computes faithfully (bfloat16 on a GPU)
DTYPES = (torch.float16,) if device == "cpu" else (torch.float16, torch.bfloat16)


def same_codes(name: str, got, codes: torch.Tensor, scales: torch.Tensor) -> None:
    if got.codes.dtype != codes.dtype or not torch.equal(got.codes.view(torch.uint8).cpu(),
                                                         codes.view(torch.uint8).cpu()):
        failures.append(f"{name}: codes differ")
    if got.scales.shape != scales.shape or got.scales.stride() != scales.stride() \
            or not torch.equal(got.scales.cpu(), scales.cpu()):
        failures.append(f"{name}: scales differ ({tuple(got.scales.stride())})")


def torch_codes() -> None:
    """``quant_groups`` (rounding by the conversion instruction on a GPU, in software under the
    interpreter) against the torch quantizer, -0 and values rounding to zero included."""
    from engine.runtime import quant_formats as qf

    for dtype in DTYPES:
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            x = (torch.randn(3, 640, generator=gen) * 5).to(dtype)
            x[:, ::7] *= 1e-5
            x[0, 3] = -0.0
            codes, scales = qt.quant_groups(x.to(device), fp8, 128)
            want_codes, want_scales = qf.quantize_fp8_groups(x, fp8, 128)
            if not (torch.equal(codes.view(torch.uint8).cpu(), want_codes.view(torch.uint8))
                    and torch.equal(scales.cpu(), want_scales)):
                failures.append(f"quant_groups {dtype} {fp8}: not the torch quantizer's codes")


def norms() -> None:
    for dtype in DTYPES:
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            for t, n in ((1, 384), (3, 512), (2, 640)):  # (384, 640: a block's masked groups)
                x = (torch.randn(t, n, generator=gen) * 3).to(dtype).to(device)
                x[:, ::9] *= 1e-4  # values that round to zero codes
                res = torch.randn(t, n, generator=gen).to(dtype).to(device)
                w = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(device)
                for r in (res, None):
                    name = f"add_rms_norm_groups {dtype} {fp8} {t}x{n} residual={r is not None}"
                    got, got_res = fused_triton.add_rms_norm_groups(x, r, w, 1e-5, fp8, 128)
                    normed, want_res = fused_triton.add_rms_norm(x, r, w, 1e-5)
                    same_codes(name, got, *qt.quant_groups(normed, fp8, 128))
                    if got.dtype != dtype or not torch.equal(got_res, want_res):
                        failures.append(f"{name}: the residual sum differs")


def silu() -> None:
    for dtype in DTYPES:
        for t, inter in ((1, 384), (2, 1152)):  # (1152: a second program, its groups masked)
            x = (torch.randn(t, 2 * inter, generator=gen) * 2).to(dtype).to(device)
            got = fused_triton.silu_and_mul_groups(x, torch.float8_e4m3fn, 128)
            want = qt.quant_groups(fused_triton.silu_and_mul(x), torch.float8_e4m3fn, 128)
            same_codes(f"silu_and_mul_groups {dtype} {t}x{inter}", got, *want)


def product() -> None:
    """The swapped product from codes made before it against the one that makes them."""
    w = (torch.randn(200, 384, generator=gen) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    ws = torch.rand(2, 3, generator=gen) * 0.01 + 1e-4
    w, ws = w.to(device), ws.to(device)
    for m in (1, 3):
        x = torch.randn(m, 384, generator=gen).to(torch.float16).to(device)
        kw = dict(block=(128, 128), out_dtype=torch.float32, config=(64, 128, 1, 4, 2))
        want = st.w8_swap(x, w, ws, act="group", **kw)
        codes, scales = qt.quant_groups(x, w.dtype, 128)
        got = st.w8_swap(codes, w, ws, act="group_codes", x_scale=scales, **kw)
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"w8_swap group_codes m={m}: "
                            f"{(got - want).abs().max().item():.3g} apart")
    try:
        st.w8_swap(codes, w, ws, act="group_codes", x_scale=scales.t().contiguous(), **kw)
        failures.append("group codes with row-major scales: no ValueError")
    except ValueError:
        pass


def model(backend: str) -> None:
    """A tiny Llama (widths whole 128-column groups, heads of 128) quantized to block fp8:
    prefill and two decode steps with the kernels before the products writing their codes
    against the same model without, logits equal, the norm and SiLU kernels writing codes in
    each of its layers (and, with the triton attention backend, its merge kernel for the
    output projection at each decode step)."""
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner
    from engine.testing import quant as tq
    from engine.testing.batches import BatchBuilder

    tmp = tempfile.mkdtemp()
    tq.tiny_llama(os.path.join(tmp, "dense"), hidden=512, heads=4, kv_heads=2,
                  intermediate=1024, vocab=256)
    tq.write_checkpoint(os.path.join(tmp, "dense"), os.path.join(tmp, "fp8"), "fp8_block",
                        block=(128, 128))
    calls = []
    made = fused_triton.add_rms_norm_groups, fused_triton.silu_and_mul_groups
    fused_triton.add_rms_norm_groups = lambda *a: calls.append("norm") or made[0](*a)
    fused_triton.silu_and_mul_groups = lambda *a: calls.append("silu") or made[1](*a)
    attend = None
    if backend == "triton":
        from engine_attention_triton.impl import TritonBackend

        attend = TritonBackend.attend_codes

        def counted(self, *a):
            got = attend(self, *a)
            if got is not None:
                calls.append("attention")
            return got
        TritonBackend.attend_codes = counted
    logits = {}
    os.environ["ENGINE_TRITON_OUTPUT_CODES"] = "1"
    for flag in ("0", "1"):
        os.environ["ENGINE_PRODUCER_CODES"] = flag
        cfg = ServerConfig(model_path=os.path.join(tmp, "fp8"), dtype="float16",
                           skip_tokenizer_init=True, attention_backend=backend,
                           max_total_tokens=512, max_running_requests=2, context_length=256,
                           random_seed=0, disable_cuda_graph=True)
        runner = ModelRunner(cfg)
        bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        row = bb.new_request()
        out = runner.forward(bb.extend([(row, list(range(3, 3 + PROMPT)))]))
        steps = [out]
        for _ in range(2):
            out = runner.forward(bb.decode([(row, int(out[-1].argmax()))]))
            steps.append(out)
        logits[flag] = torch.cat(steps).float().cpu()
    os.environ.pop("ENGINE_PRODUCER_CODES")
    os.environ.pop("ENGINE_TRITON_OUTPUT_CODES")
    fused_triton.add_rms_norm_groups, fused_triton.silu_and_mul_groups = made
    if attend is not None:
        TritonBackend.attend_codes = attend
    # each forward taking codes: two norms and one SiLU a layer (2 layers): the two decode
    # steps, and the prefill where its rows are few (more take cuBLAS's block-scaled product
    # or the row-wise kernels); the merge kernel at the two decode steps
    forwards = 2 + (PROMPT <= 16)
    want = {"norm": forwards * 2 * 2, "silu": forwards * 2,
            "attention": 2 * 2 if backend == "triton" else 0}
    if {k: calls.count(k) for k in want} != want:
        failures.append(f"tiny block fp8 Llama ({backend}): codes written {calls}")
    if not torch.equal(logits["0"], logits["1"]):
        err = (logits["1"] - logits["0"]).abs().max().item()
        failures.append(f"tiny block fp8 Llama ({backend}): logits differ by {err:.3g}")


#: the tiny model's prompt length (on the GPU long enough for the triton backend to split its
#: decode over several programs: the merge kernel writes the codes)
PROMPT = 200 if device == "cuda" else 3


torch_codes()
norms()
silu()
product()
model("torch_native")
if device == "cuda":  # (the triton backend refuses a CPU; its codes kernel is checked under the
    model("triton")  # interpreter in tests/attention/triton_interpret_checks.py)
print(json.dumps(failures))

"""What the third-party MoE kernel libraries do on this GPU with this torch: import, one call on
a small bf16 layer, and the result against engine.api.moe.torch_reference. Prints a table; the
outcome decides whether a runner plugin can be real here (docs/benchmarks/moe.md).

    python3 benchmarks/moe_probe_gpu.py     (wheels: pip install --no-deps --target ... *.whl)
"""

from __future__ import annotations

import inspect
import time
import traceback

import torch

from engine.api.moe import route, torch_reference

E, K, H, I, T = 8, 2, 256, 128, 16


def data():
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device="cuda", generator=g, dtype=torch.bfloat16) / 16
    w2 = torch.randn(E, H, I, device="cuda", generator=g, dtype=torch.bfloat16) / 11
    x = torch.randn(T, H, device="cuda", generator=g, dtype=torch.bfloat16)
    router = torch.randn(E, H, device="cuda", generator=g, dtype=torch.bfloat16)
    w, ids = route(x @ router.t(), K, True)
    return w13, w2, x, ids, w


def rel(out, ref) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def flashinfer_cutlass() -> str:
    from flashinfer.fused_moe import cutlass_fused_moe

    sig = str(inspect.signature(cutlass_fused_moe))[:300]
    w13, w2, x, ids, w = data()
    ref = torch_reference(w13, w2, x, ids, w)
    t0 = time.time()
    notes = [f"signature {sig}"]
    for order, fc1 in (("gate,up", w13), ("up,gate", torch.cat([w13[:, I:], w13[:, :I]], 1))):
        out = torch.empty_like(x)
        res = cutlass_fused_moe(x, ids.to(torch.int32), w.float(), fc1.contiguous(),
                                w2.contiguous(), torch.bfloat16, quant_scales=[], output=out)
        out = res[0] if isinstance(res, (list, tuple)) else res
        torch.cuda.synchronize()
        notes.append(f"w13 as {order}: rel err {rel(out, ref):.1e}")
    notes.append(f"first call incl. JIT build {time.time() - t0:.0f} s")
    return "; ".join(notes)


def humming() -> str:
    import humming

    names = [n for n in dir(humming) if not n.startswith("_")]
    return f"imported {getattr(humming, '__version__', '?')}; exports {names[:25]}"


def deep_gemm() -> str:
    import deep_gemm

    names = [n for n in dir(deep_gemm) if not n.startswith("_")]
    return f"imported; exports {names[:30]}"


def main() -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print("| library | outcome |\n|---|---|")
    for name, fn in (("humming-kernels", humming), ("sgl-deep-gemm", deep_gemm),
                     ("flashinfer cutlass_fused_moe", flashinfer_cutlass)):
        try:
            msg = "ok: " + fn()
        except BaseException as exc:  # noqa: BLE001 - the outcome is the record
            tb = traceback.format_exc().strip().splitlines()
            msg = f"{type(exc).__name__}: {str(exc)[:400]} | " + " / ".join(tb[-4:])[:600]
        print(f"| {name} | {msg.replace(chr(10), ' ')} |", flush=True)


if __name__ == "__main__":
    main()

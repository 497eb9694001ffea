"""Decode-step cost of the linear layers of Llama-3-8B (32 layers: qkv 4096->6144, o, gate_up
4096->28672, down 14336->4096) under each quantization format, against bf16, at several batch
sizes, on a GPU.

Dummy weights are quantized by the checkpoint writers of :mod:`engine.testing.quant`, loaded
through each choice's plugin (packed on the GPU: :mod:`engine.runtime.quant_triton`). Each
format's four layers are copied ``--copies`` times (distinct memory, more than the 60 MB L2
holds), the copies' products are captured in one CUDA graph (as a decode step runs them) and
replayed; the step is the replay's time per copy times 32. Attention, norms and the head are
not included: this isolates what the choice changes. The roofline column is the step's weight
bytes over 4.3 TB/s.

    python benchmarks/quant_gpu.py [--schemes a,b] [--batches 1,32] [--launches FILE]
    python benchmarks/quant_gpu.py --step-search fp8_tensor [--write-launches FILE]
    python benchmarks/quant_gpu.py --schemes fp8_block --groups-per 32 [--cached-group-codes]
    python benchmarks/quant_gpu.py --schemes fp8_block --model-inputs

``--step-search SCHEME`` chooses the swapped 8-bit kernel's one-row launches by this step
rather than by each layer alone (``swap_gpu.py --search``): one shape class at a time (q/k/v,
o, gate/up, down), every candidate of :data:`STEP_CANDIDATES` (block fp8:
:data:`STEP_CANDIDATES_BLOCK`) timed in the whole step with the other classes at their best so
far; it prints each class's table and writes the best launches as ``--launches`` reads them.

``--groups-per N`` sets how many 128-column groups one program of block fp8's group
quantization takes (``quant_triton.GROUPS_PER_PROGRAM``). ``--cached-group-codes`` is a bound,
not a product: each input's group codes are made once, at the warm-up outside the graph, and
handed back afterwards, so the replayed step runs block fp8's products without their
quantization launches (what the step would cost if the kernels before the products wrote the
codes). ``--model-inputs``: each layer gets its input as the decoder hands it over, group
codes where the layer asks for them (``Linear.group_codes``) and the kernel before it writes
them (the norms, SiLU-and-mul, and the triton attention backend's decode merge;
``ENGINE_TRITON_OUTPUT_CODES=0``: not the merge), made outside the graph, as those kernels
make them in the model (there in place of the row they write otherwise).

(The launch configurations of the few-row kernels come from ``benchmarks/gemv_gpu.py
--search``.)
"""

from __future__ import annotations

import argparse
import copy
import importlib
import itertools
import os

import torch

from engine.api.quant import Linear
from engine.testing import quant as tq

SHAPES = {"self_attn.qkv_proj": (4096, (4096, 1024, 1024)), "self_attn.o_proj": (4096, (4096,)),
          "mlp.gate_up_proj": (4096, (14336, 14336)), "mlp.down_proj": (14336, (4096,))}
PARTS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
         "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}
LAYERS = 32
BANDWIDTH = 4.3e12
DEVICE = "cuda"
SCHEMES = {"gptq": {"group": 128}, "gptq_act_order": {"group": 128, "desc_act": True},
           "awq": {"group": 128, "sym": False}, "ct_wna16": {"group": 128}, "mlx4": {"group": 64},
           "ct_w8a16": {}, "fp8_tensor": {}, "ct_fp8_dynamic": {}, "fp8_block": {},
           "modelopt_fp8": {}, "ct_w8a8_int8": {}, "ct_fp8_static": {},
           "humming_gptq": {"group": 128}, "humming_awq": {"group": 128, "sym": False},
           "humming_fp8_block": {}}
#: schemes written as another scheme's checkpoint, and the choice that serves them
WRITTEN = {"gptq_act_order": ("gptq", "gptq"), "humming_gptq": ("gptq", "humming"),
           "humming_awq": ("awq", "humming"), "humming_fp8_block": ("fp8_block", "humming")}


def written_as(scheme: str) -> tuple[str, str]:
    """(the checkpoint scheme written, the ``--quantization`` choice that loads it)."""
    return WRITTEN.get(scheme, (scheme, tq.CHOICE.get(scheme, scheme)))


def layer_bytes(layer: torch.nn.Module) -> int:
    """Bytes a product reads: the layer's tensors (parameters, buffers and packed codes)."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    for t in itertools.chain(layer.parameters(), layer.buffers()):
        add(t)
    for v in vars(layer).values():
        add(v)
        for t in getattr(v, "__dict__", {}).values():
            add(t)
        for part in getattr(v, "parts", []):
            for t in vars(part).values():
                add(t)
    return total


def build(scheme: str | None, key: str) -> Linear:
    k, shards = SHAPES[key]
    prefix = "model.layers.0." + key.split(".")[0]
    gen = torch.Generator().manual_seed(0)
    dense = {f"{prefix}.{p}.weight": torch.randn(n, k, generator=gen) * k ** -0.5
             for p, n in zip(PARTS[key], shards)}
    if scheme is None:
        layer = Linear(k, sum(shards), dtype=torch.bfloat16, shards=shards)
        layer.weight.data.copy_(torch.cat(list(dense.values())))
        return layer.to(DEVICE)
    written, choice = written_as(scheme)
    tensors, qcfg, _ = tq.quantize_state(dense, written, **SCHEMES[scheme])
    impl = importlib.import_module(f"engine_quant_{choice.replace('-', '_')}.impl")
    method = impl.engine_create_quant_method(
        quant_config={"quant_method": "", **tq.normalized_config(written, qcfg)})
    tensors = dict(method.checkpoint_weights(iter(tensors.items())))
    parts = dict(zip(PARTS[key], shards))
    with torch.device(DEVICE):
        return tq.load_fused_layer(method.for_layer("model.layers.0." + key),
                                   {n: t.to(DEVICE) for n, t in tensors.items()}, prefix, parts,
                                   k, torch.bfloat16)


#: layers whose input the decoder's kernels before them write as group codes where the layer
#: takes them (``--model-inputs``): after a norm (q/k/v, gate/up) or SiLU-and-mul (down); and
#: after the triton attention backend's decode merge (o; ``ENGINE_TRITON_OUTPUT_CODES=0``: not)
WRITTEN_AS_CODES = ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj") + (
    ("self_attn.o_proj",) if os.environ.get("ENGINE_TRITON_OUTPUT_CODES") != "0" else ())
MODEL_INPUTS = False


def step_ms(layers: dict[str, Linear], batch: int, copies: int, iters: int = 20) -> float:
    sets = [layers] + [{k: copy.deepcopy(v) for k, v in layers.items()}
                       for _ in range(copies - 1)]
    xs = {key: torch.randn(batch, SHAPES[key][0], dtype=torch.bfloat16, device="cuda")
          for key in layers}
    if MODEL_INPUTS:  # (the codes made here, outside the graph: in the model the norm makes them)
        from engine.runtime import quant_triton
        from engine.runtime.linear import GroupCodes

        for key in WRITTEN_AS_CODES:
            fmt = layers[key].group_codes(xs[key])
            if fmt is not None:
                xs[key] = GroupCodes(*quant_triton.quant_groups(xs[key], *fmt), fmt[1],
                                     xs[key].dtype)

    def run():
        for s in sets:
            for key, layer in s.items():
                layer(xs[key])

    ms = replay_ms(run, iters)
    del sets
    return ms / copies * LAYERS


def replay_ms(run, iters: int = 20) -> float:
    """``run()`` captured in one CUDA graph (after two warm-up calls on a side stream) and
    replayed ``iters`` times: ms per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


#: the one-row launches (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) ``--step-search`` tries per
#: shape class of :func:`engine.runtime.swap_triton.swap_class`
STEP_CANDIDATES = {
    "tall": [(64, 512, 1, 4, 4), (64, 512, 1, 4, 3), (64, 512, 1, 4, 5), (64, 1024, 1, 4, 3),
             (64, 256, 2, 4, 4), (64, 512, 1, 8, 4), (64, 512, 1, 8, 3), (64, 256, 2, 8, 4)],
    "square": [(64, 512, 2, 4, 4), (64, 512, 2, 4, 3), (64, 512, 2, 4, 5), (64, 1024, 2, 4, 3),
               (128, 256, 4, 4, 4), (64, 512, 2, 8, 4), (64, 256, 4, 8, 4), (64, 512, 1, 8, 4)],
    "wide": [(64, 512, 1, 4, 3), (64, 512, 1, 4, 4), (128, 256, 1, 8, 3), (128, 256, 1, 4, 4),
             (64, 256, 1, 4, 5), (64, 512, 1, 8, 3), (64, 256, 1, 8, 4), (64, 512, 1, 8, 4)],
    "deep": [(128, 256, 4, 4, 4), (64, 512, 2, 4, 4), (64, 512, 2, 4, 5), (64, 1024, 2, 4, 3),
             (64, 512, 4, 4, 3), (64, 512, 2, 8, 4), (64, 256, 4, 8, 4), (64, 512, 4, 8, 3)],
}
# (8 warps on 64 outputs: two warp groups, each the products of half the padded rows, so
# half the loads and the row's quantization a thread, two warps a scheduler)

#: the same for block fp8 (BLOCK_K is the scale block's; a sixth element: scale blocks an
#: iteration; 16-32 outputs a program: one or two warps of ``mma.sync`` products, which wait
#: for nothing but their own registers, where a warp group's products wait at each block)
STEP_CANDIDATES_BLOCK = {
    "tall": [(128, 128, 8, 4, 4), (64, 128, 8, 4, 4), (64, 128, 4, 4, 4, 2),
             (128, 128, 4, 4, 3, 2), (64, 128, 2, 4, 4, 4), (64, 128, 1, 4, 4, 4),
             (32, 128, 2, 1, 4), (32, 128, 4, 1, 4), (32, 128, 2, 1, 6), (32, 128, 2, 2, 4),
             (16, 128, 2, 1, 4), (32, 128, 2, 1, 4, 2)],
    "square": [(128, 128, 8, 4, 4), (64, 128, 8, 4, 4), (64, 128, 4, 4, 4, 2),
               (128, 128, 4, 4, 3, 2), (64, 128, 2, 4, 4, 4), (64, 128, 4, 4, 3, 4),
               (32, 128, 4, 1, 4), (32, 128, 8, 1, 4), (32, 128, 4, 1, 6), (32, 128, 4, 2, 4),
               (16, 128, 4, 1, 4), (32, 128, 4, 1, 4, 2)],
    "wide": [(128, 128, 2, 4, 3), (64, 128, 1, 4, 4, 4), (64, 128, 2, 4, 3, 2),
             (128, 128, 1, 4, 3, 2), (64, 128, 1, 4, 3, 4), (128, 128, 1, 4, 4),
             (32, 128, 1, 1, 4), (32, 128, 1, 1, 6), (32, 128, 2, 1, 4), (32, 128, 1, 2, 4),
             (16, 128, 1, 1, 4), (32, 128, 1, 1, 4, 2)],
    "deep": [(64, 128, 8, 4, 3, 2), (64, 128, 4, 4, 4, 4), (128, 128, 8, 4, 3, 2),
             (64, 128, 8, 4, 4, 2), (64, 128, 2, 4, 3, 4), (128, 128, 4, 4, 3, 4),
             (32, 128, 8, 1, 4), (32, 128, 16, 1, 4), (32, 128, 8, 1, 6), (32, 128, 8, 2, 4),
             (16, 128, 8, 1, 4), (32, 128, 8, 1, 4, 2)],
}


def cache_group_codes() -> None:
    """``--cached-group-codes``: the swapped kernel's group quantization answered from a cache
    filled by the first call for each input (module docstring)."""
    from engine.runtime import swap_triton

    made = swap_triton.quant_groups
    cache: dict = {}

    def cached(x, dtype, group):
        key = (x.data_ptr(), tuple(x.shape), dtype, group)
        if key not in cache:
            cache[key] = made(x, dtype, group)
        return cache[key]

    swap_triton.quant_groups = cached


def step_search(scheme: str, copies: int, path: str | None) -> None:
    """Coordinate search of the one-row launches by the step's time (module docstring)."""
    import json

    from engine.runtime import swap_triton

    codes = "int8" if "int8" in scheme else "fp8"
    kind = "block" if "block" in scheme else "a8"
    layers = {k: build(scheme, k) for k in SHAPES}
    best = {}
    table = STEP_CANDIDATES_BLOCK if kind == "block" else STEP_CANDIDATES
    for cls, launches in table.items():
        key = (codes, kind, cls, 1)
        rows = []
        for launch in launches:
            swap_triton.SMALL[key] = launch
            try:
                rows.append((step_ms(layers, 1, copies), launch))
            except Exception as exc:  # noqa: BLE001 - a launch that does not fit: skipped
                print(f"{cls} {launch}: {type(exc).__name__}", flush=True)
        rows.sort()
        swap_triton.SMALL[key] = best[key] = rows[0][1]
        print(f"\n| {scheme} {cls} launch | step ms |\n|---|---|")
        for ms, launch in rows:
            print(f"| {launch} | {ms:.3f} |", flush=True)
    print(f"\n{scheme}: step {step_ms(layers, 1, copies):.3f} ms at the launches found")
    if path:
        with open(path, "w") as f:
            json.dump({",".join(map(str, k)): list(v) for k, v in best.items()}, f, indent=1)


def read_launches(path: str) -> dict:
    """{(codes, activations, shape class, rows bucket): launch} from a JSON file of
    {"codes,activations,class,bucket": [launch]}."""
    import json

    with open(path) as f:
        raw = json.load(f)
    out = {}
    for key, launch in raw.items():
        codes, kind, cls, bucket = key.split(",")
        out[(codes, kind, cls, int(bucket))] = tuple(launch)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--launches", help="a JSON file of swapped-kernel launches to use instead "
                    "of the shipped ones (what swap_gpu.py --search --write-launches wrote)")
    ap.add_argument("--step-search", metavar="SCHEME",
                    help="choose the one-row launches of SCHEME by the step (module docstring)")
    ap.add_argument("--write-launches", help="with --step-search: where the launches go")
    ap.add_argument("--groups-per", type=int, help="groups a program of block fp8's group "
                    "quantization takes")
    ap.add_argument("--cached-group-codes", action="store_true",
                    help="a bound: block fp8's group codes made once, outside the graph")
    ap.add_argument("--model-inputs", action="store_true",
                    help="inputs as the decoder hands them over (group codes where asked)")
    args = ap.parse_args()
    global MODEL_INPUTS
    MODEL_INPUTS = args.model_inputs
    if args.groups_per:
        from engine.runtime import quant_triton

        quant_triton.GROUPS_PER_PROGRAM = args.groups_per
    if args.cached_group_codes:
        cache_group_codes()
    if args.launches:
        from engine.runtime import swap_triton

        for key, launch in read_launches(args.launches).items():
            swap_triton.SMALL[key] = launch
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    if args.step_search:
        step_search(args.step_search, args.copies, args.write_launches)
        return
    batches = [int(b) for b in args.batches.split(",")]
    dense = {k: build(None, k) for k in SHAPES}
    base = {b: step_ms(dense, b, args.copies) for b in batches}
    base_bytes = sum(layer_bytes(v) for v in dense.values()) * LAYERS
    del dense
    head = " | ".join(f"batch {b} ms" for b in batches)
    print(f"| format (choice) | weight GB/step | roofline ms | {head} | vs bf16 "
          f"({' / '.join(map(str, batches))}) |")
    print("|---|---|---|" + "---|" * len(batches) + "---|")
    print(f"| bf16 | {base_bytes / 1e9:.2f} | {base_bytes / BANDWIDTH * 1e3:.3f} | "
          + " | ".join(f"{base[b]:.3f}" for b in batches) + " | "
          + " / ".join("1.00" for _ in batches) + " |", flush=True)
    for s in args.schemes.split(","):
        layers = {k: build(s, k) for k in SHAPES}
        nbytes = sum(layer_bytes(v) for v in layers.values()) * LAYERS
        ms = {b: step_ms(layers, b, args.copies) for b in batches}
        choice = written_as(s)[1]
        print(f"| {s} ({choice}) | {nbytes / 1e9:.2f} | {nbytes / BANDWIDTH * 1e3:.3f} | "
              + " | ".join(f"{ms[b]:.3f}" for b in batches) + " | "
              + " / ".join(f"{ms[b] / base[b]:.2f}" for b in batches) + " |", flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Conformance kit of the attention family: a backend against an independent float32 reference.

``check(name, make_backend)`` runs tiny random cases and returns a list of failures (empty: the
backend conforms). ``make_backend(pool=..., model_config=..., config=...)`` builds the backend
(the family hook's keyword arguments). Each case runs, over 2 layers, a single-request prefill,
a ragged prefill (lengths 1 .. many pages, one ending exactly on a page boundary), prefix +
extend chunks mixed with a new request, then decode steps (on CUDA, for a backend that declares
``supports_cuda_graph``, also replayed from CUDA graphs captured for larger, padded batch sizes,
across page boundaries), then speculative verify batches
(``VERIFY`` mode: a chain for every backend; a draft tree with its ``tree_mask`` for a backend
that declares ``supports_tree_verify``; on CUDA, for one that declares
``supports_verify_graph``, trees replayed from captured verify graphs), checking:

* outputs (shape [T, Hq, D], all finite) against plain masked-softmax attention computed here;
* every new token's K/V stored at its ``out_cache_loc`` slot, in the right layer;
* no read of a slot the batch does not own: unwritten slots are poisoned with NaN first (the
  reserved padding page holds large finite garbage instead; backends may read and mask it).

Cases: page sizes 1 and 16 (and 64 on CUDA), GQA ratios 1, 3, 4, head dims 64 and 128; float32 on CPU
(tolerance 1e-4 abs + 1e-4 rel), bfloat16 on CUDA (2e-2 abs + 2e-2 rel). Pages are handed out
shuffled, so a request's pages are never contiguous.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from engine.config import ServerConfig
from engine.models.config import ModelConfig
from engine.runtime.attention import AttentionLayerSpec, KVPool
from engine.runtime.batch import Batch, ForwardMode
from engine.testing.batches import BatchBuilder

TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2),
              torch.float16: (5e-3, 5e-3)}
NUM_LAYERS, NUM_KV_HEADS = 2, 2
PAGE_SIZES, GQA_RATIOS, HEAD_DIMS = (1, 16), (1, 3, 4), (64, 128)
GPU_EXTRA_PAGE_SIZES = (64,)  #: also run on CUDA


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
              scale: float, tree: torch.Tensor | None = None) -> torch.Tensor:
    """Plain attention of new tokens at positions ``start..`` over keys [S, Hkv, D] (float32);
    with ``tree`` ([T, T] bool) new token ``j`` sees the prefix and the new tokens ``k`` with
    ``tree[j, k]`` instead of ``k <= j``."""
    ratio = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(ratio, dim=1)  # [S, Hq, D]
    v = values.float().repeat_interleave(ratio, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale
    pos = torch.arange(start, start + q.shape[0])[:, None]
    allowed = torch.arange(keys.shape[0])[None, :] <= pos
    if tree is not None:
        allowed = torch.cat([torch.ones(q.shape[0], start, dtype=torch.bool), tree.cpu()], 1)
    scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


class _Case:
    def __init__(self, make_backend: Callable[..., Any], page_size: int, ratio: int,
                 head_dim: int, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.dtype, self.device, self.ratio = dtype, device, ratio
        self.gen = torch.Generator().manual_seed(seed)
        hq = NUM_KV_HEADS * ratio
        self.specs = [AttentionLayerSpec(i, hq, NUM_KV_HEADS, head_dim, head_dim ** -0.5)
                      for i in range(NUM_LAYERS)]
        pages = 64 if page_size == 1 else 48
        # the longest request: 6 pages + a few tokens, then the graph verify steps
        width = max(256, 8 * page_size + 128)
        num_slots = pages * page_size if page_size > 1 else 512
        self.pool = KVPool(num_layers=NUM_LAYERS, num_kv_heads=NUM_KV_HEADS, head_dim=head_dim,
                           num_slots=num_slots, page_size=page_size, dtype=dtype, device=device)
        for buf in self.pool.k + self.pool.v:
            buf.fill_(float("nan"))
            buf[:page_size] = 1e4  # the reserved padding page: finite garbage
        mc = ModelConfig(architecture="LlamaForCausalLM", hidden_size=hq * head_dim,
                         intermediate_size=4, num_hidden_layers=NUM_LAYERS,
                         num_attention_heads=hq, num_key_value_heads=NUM_KV_HEADS,
                         head_dim=head_dim, vocab_size=8, max_position_embeddings=width)
        self.backend = make_backend(pool=self.pool, model_config=mc,
                                    config=ServerConfig(page_size=page_size, device=device.type))
        r2t = torch.zeros((8, width), dtype=torch.int64, device=device)
        self.builder = BatchBuilder(r2t, num_slots, page_size, shuffle=True, seed=seed)
        self.kv: dict[int, list[tuple[list[torch.Tensor], list[torch.Tensor]]]] = {}
        self.tol = TOLERANCES[dtype]

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.device, self.dtype)

    def step(self, batch: Batch, rows: list[int]) -> list[str]:
        errors: list[str] = []
        tree_mask = batch.tree_mask  # as built (a backend must not change what is asked)
        self.backend.prepare(batch)
        tokens = batch.num_tokens
        for spec in self.specs:
            q = self.rand(tokens, spec.num_q_heads, spec.head_dim)
            k = self.rand(tokens, spec.num_kv_heads, spec.head_dim)
            v = self.rand(tokens, spec.num_kv_heads, spec.head_dim)
            out = self.backend.forward(q, k, v, spec, batch)
            found = self.check_layer(spec, batch, rows, q, k, v, out, tree_mask)
            errors += found
            if found and found[0].endswith("(shape)"):
                return errors
        return errors

    def check_layer(self, spec: AttentionLayerSpec, batch: Batch, rows: list[int],
                    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    tree_mask: torch.Tensor | None) -> list[str]:
        """One layer's output and stored K/V against the reference (and record its K/V)."""
        errors: list[str] = []
        spec0, tokens = self.specs[0], batch.num_tokens
        where = f"layer {spec.layer_id} {batch.mode.value}"
        if tuple(out.shape) != (tokens, spec0.num_q_heads, spec0.head_dim):
            return [f"{where}: output shape {tuple(out.shape)}, expected "
                    f"{(tokens, spec0.num_q_heads, spec0.head_dim)} (shape)"]
        if not torch.isfinite(out).all():
            errors.append(f"{where}: non-finite output (read an unwritten slot or left "
                          "elements unwritten)")
        loc = batch.out_cache_loc
        if not (torch.equal(self.pool.k[spec.layer_id][loc], k.to(self.pool.dtype))
                and torch.equal(self.pool.v[spec.layer_id][loc], v.to(self.pool.dtype))):
            errors.append(f"{where}: new K/V not stored at out_cache_loc")
        start = 0
        for i, row in enumerate(rows):
            n, pre = batch.extend_lens_cpu[i], batch.prefix_lens_cpu[i]
            ks, vs = self.kv.setdefault(row, [([], []) for _ in self.specs])[spec.layer_id]
            ks.append(k[start:start + n])
            vs.append(v[start:start + n])
            tree = tree_mask[i, :n, :n] if tree_mask is not None else None
            want = reference(q[start:start + n], torch.cat(ks), torch.cat(vs), pre,
                             spec.scaling, tree)
            got = out[start:start + n].float()
            atol, rtol = self.tol
            if not torch.allclose(got, want, atol=atol, rtol=rtol):
                err = (got - want).abs().max().item()
                errors.append(f"{where}: request {i} (prefix {pre}, new {n}) differs from "
                              f"the reference by {err:.3g}")
            start += n
        return errors

    def run(self) -> list[str]:
        b, ps = self.builder, self.pool.page_size
        errors: list[str] = []
        solo = b.new_request()
        errors += self.step(b.extend([(solo, list(range(20)))]), [solo])
        lengths = [1, 7, 2 * ps if ps > 1 else 5, 5 * ps + 3 if ps > 1 else 41]
        rows = [b.new_request() for _ in lengths]
        errors += self.step(b.extend([(r, [1] * n) for r, n in zip(rows, lengths)]), rows)
        fresh = b.new_request()
        chunk = [(rows[1], [2] * 3), (fresh, [3] * 9), (rows[3], [4] * (ps + 1)),
                 (solo, [5] * 2)]
        errors += self.step(b.extend(chunk), [r for r, _ in chunk])
        live = rows + [fresh, solo]
        for _ in range(2):
            errors += self.step(b.decode([(r, 6) for r in live]), live)
        b.free(rows[0])
        live = live[1:]
        errors += self.step(b.decode([(r, 7) for r in live]), live)
        if self.device.type == "cuda" and getattr(self.backend, "supports_cuda_graph", False):
            errors += self.graph_decode(live)
        # speculative verify: a chain (plain causal), then a tree where the backend has it
        errors += self.step(self.verify(live[:3], [[8, 9, 10], [8], [8, 9]], None), live[:3])
        if getattr(self.backend, "supports_tree_verify", False):
            trees = [[-1, -1, 0, 1, 2], [-1], [-1, 0, -1]]
            toks = [[9] * (1 + len(t)) for t in trees]
            errors += self.step(self.verify(live[:3], toks, trees), live[:3])
            if self.device.type == "cuda" and getattr(self.backend, "supports_verify_graph",
                                                      False):
                errors += self.graph_verify(live[:3])
        return errors

    def _graph_buffers(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Static q, k, v of ``n`` tokens per layer (a captured forward reads them)."""
        return [tuple(torch.zeros(n, h, s.head_dim, dtype=self.dtype, device=self.device)
                      for h in (s.num_q_heads, s.num_kv_heads, s.num_kv_heads))
                for s in self.specs]  # type: ignore[misc]

    def _replay_checked(self, run: Callable[[Batch], torch.Tensor], batch: Batch,
                        rows: list[int], bufs: list[tuple[torch.Tensor, ...]],
                        label: str) -> list[str]:
        """Fill the static q/k/v with random values, replay, check each layer as a step."""
        n = batch.num_tokens
        qkv = []
        for q, k, v in bufs:
            for buf in (q, k, v):
                buf[:n] = self.rand(n, buf.shape[1], buf.shape[2])
            qkv.append((q[:n].clone(), k[:n].clone(), v[:n].clone()))
        tree_mask = batch.tree_mask
        out = run(batch)
        errors: list[str] = []
        for spec, (q, k, v) in zip(self.specs, qkv):
            errors += [f"{label}: {e}" for e in self.check_layer(
                spec, batch, rows, q, k, v, out[:, spec.layer_id].to(self.dtype), tree_mask)]
        return errors

    def graph_verify(self, rows: list[int]) -> list[str]:
        """Tree verify forwards replayed from CUDA graphs captured as the model runner
        captures them (every request 4 new tokens; batch sizes above the live one, so padded
        requests ride along), checked like eager steps while the sequences grow across page
        boundaries and the trees change between replays."""
        from engine.runtime.cuda_graph import VerifyGraphs

        width, n_max = 4, len(rows) + 2
        bufs = self._graph_buffers(n_max * width)

        def forward(batch: Batch) -> torch.Tensor:
            t = batch.num_tokens
            return torch.stack([self.backend.forward(q[:t], k[:t], v[:t], s, batch).float()
                                for s, (q, k, v) in zip(self.specs, bufs)], 1)

        graphs = VerifyGraphs(forward, self.backend, self.builder.req_to_token, n_max, width,
                              sizes=[len(rows) + 1, n_max])
        shapes = [[-1, 0, 0], [-1, -1, 1], [-1, 0, 1], [-1, -1, -1]]
        errors: list[str] = []
        for step in range(max(3, self.pool.page_size // width + 2)):  # past a page boundary
            live = rows if step % 2 == 0 else rows[:-1]
            trees = [shapes[(step + i) % len(shapes)] for i in range(len(live))]
            batch = self.verify(live, [[9] * width for _ in live], trees)
            size = graphs.size_for(batch)
            if not size:
                return [f"verify graph: no captured size serves {len(live)} requests"]
            errors += self._replay_checked(lambda b: graphs.run(b, size), batch, live, bufs,
                                           f"verify CUDA graph replay {step}")
            if errors:
                return errors
        return errors

    def graph_decode(self, rows: list[int]) -> list[str]:
        """Decode steps replayed from CUDA graphs captured (as the model runner captures them)
        for batch sizes above the live one, so padded rows ride along; each replay is checked
        like an eager step (outputs against the reference, K/V stored). The sequences grow
        across page boundaries between replays."""
        from engine.runtime.cuda_graph import DecodeGraphs

        n_max = len(rows) + 3
        bufs = self._graph_buffers(n_max)

        def forward(batch: Batch) -> torch.Tensor:
            n = batch.batch_size
            return torch.stack([self.backend.forward(q[:n], k[:n], v[:n], s, batch).float()
                                for s, (q, k, v) in zip(self.specs, bufs)], 1)

        errors: list[str] = []
        graphs = DecodeGraphs(forward, self.backend, self.builder.req_to_token, n_max,
                              sizes=[len(rows) + 1, n_max], sample=False)
        steps = 2 * self.pool.page_size + 1 if self.pool.page_size > 1 else 3
        for step in range(steps):
            live = rows if step % 2 == 0 else rows[:-1]  # two padded sizes in turn
            batch = self.builder.decode([(r, 8) for r in live])
            errors += self._replay_checked(graphs.run, batch, live, bufs,
                                           f"CUDA graph replay {step}")
            if errors:
                return errors
        return errors

    def verify(self, rows: list[int], tokens: list[list[int]],
               trees: list[list[int]] | None) -> Batch:
        """A VERIFY batch: each row's last token plus draft nodes (``trees``: the nodes'
        parents, -1 the last token; None: chains)."""
        batch = self.builder.extend(list(zip(rows, tokens)), all_logits=True)
        batch.mode = ForwardMode.VERIFY
        if trees is None:
            return batch
        width = max(len(t) for t in tokens)
        mask = torch.zeros(len(rows), width, width, dtype=torch.bool)
        depth_pos = []
        for i, parents in enumerate(trees):
            anc: list[list[int]] = [[0]]
            depths = [0]
            for j, p in enumerate(parents):
                anc.append(anc[p + 1] + [j + 1])
                depths.append(depths[p + 1] + 1)
            for j, a in enumerate(anc):
                mask[i, j, a] = True
            for j in range(len(anc), width):
                mask[i, j, j] = mask[i, j, 0] = True
            depth_pos += [batch.prefix_lens_cpu[i] + d for d in depths]
        batch.tree_mask = mask.to(self.device)
        batch.positions = torch.tensor(depth_pos, dtype=torch.int64, device=self.device)
        return batch


def check(name: str, make_backend: Callable[..., Any],
          device: torch.device | str | None = None, *,
          page_sizes: tuple[int, ...] | None = None, gqa_ratios: tuple[int, ...] = GQA_RATIOS,
          head_dims: tuple[int, ...] = HEAD_DIMS) -> list[str]:
    """Run every case (or those of the given page sizes, GQA ratios and head dims); the
    failures as ``"<name> page_size=.. gqa=.. head_dim=..: ..."``."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    failures: list[str] = []
    if page_sizes is None:
        extra = GPU_EXTRA_PAGE_SIZES if dev.type == "cuda" else ()
        page_sizes = PAGE_SIZES + tuple(p for p in extra if p not in PAGE_SIZES)
    combos = itertools.product(page_sizes, gqa_ratios, head_dims)
    for seed, (ps, ratio, dim) in enumerate(combos):
        label = f"{name} page_size={ps} gqa={ratio} head_dim={dim} {str(dtype)[6:]}"
        try:
            errors = _Case(make_backend, ps, ratio, dim, dev, dtype, seed).run()
        except Exception as exc:  # a crash is a failure of this case, not of the kit
            errors = [f"raised {type(exc).__name__}: {exc}"]
        failures += [f"{label}: {e}" for e in errors]
    return failures


def plugin_backend(name: str) -> Callable[..., Any]:
    """A ``make_backend`` for :func:`check` that builds the installed attention plugin ``name``
    as ``engine serve`` does (through the start-up assembly, with its default options), also
    where it is listed as unavailable (a kernel run under an interpreter)."""
    from engine.assembly import Assembly

    assembly = Assembly(ServerConfig())
    record = assembly.registry.find(name, "attention")[0]
    return lambda **kwargs: assembly.build(record, **kwargs)

"""The speculative family's interface (hook ``engine_create_speculative_proposer``).

A proposer only *proposes*: each decode step it drafts, per running request, a chain or a tree
of tokens that may follow the request's last token. The core verifies every draft in one target
forward (the last verified token plus the draft nodes are that forward's extend tokens, a tree
with its attention mask) and walks each tree from the root: the target's next token is drawn at
the root; when a child carries that token the walk moves there and draws again, else it stops.
Greedy, every emitted token is the target's argmax (token-for-token what decoding without
drafts gives); sampled, every emitted token is drawn from the target's own distribution with
the request's generator (the draft acts as a deterministic proposal, so acceptance never
changes the distribution). Rejected nodes' KV is freed in the same step.

What a plugin builds on (given to its hook as ``context``, a :class:`SpecContext`):

* ``context.num_steps`` / ``eagle_topk`` / ``num_draft_tokens``: the user's values, ``None``
  when unset (each proposer has its own defaults; ``num_draft_tokens`` is the verify width per
  request: the last verified token plus at most ``num_draft_tokens - 1`` draft nodes);
* ``context.load_draft_model()``: the draft model of ``--speculative-draft-model-path`` (same
  tokenizer as the target, checked), a :class:`DraftModel` with its own KV pool;
* ``context.target``: the target's embedding and head and its captured hidden states, for
  drafts that read them (:class:`TargetModel`), or ``None`` when the core cannot give them;
  also the target itself over a block of tokens after each request, with a LoRA adapter on
  chosen rows (:meth:`TargetModel.run_block`: drafts from the target, UNO).

A proposer states its own constraints: :attr:`Proposer.drafts_trees` (a tree needs an attention
backend with ``supports_tree_verify``; the core refuses the combination at start-up otherwise).

For draft heads written in plain PyTorch (EAGLE family, DFlash): :func:`rope`,
:class:`HeadCache` (a request's contiguous per-layer K/V cache and how many verified tokens the
head has read), :class:`RowCache` (every request's K/V as rows of one dense buffer, for
batched forwards of fixed shapes) and :class:`BatchGraphs` (CUDA graphs of such forwards,
captured per batch bucket on first use).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

__all__ = ["BatchGraphs", "Draft", "DraftModel", "HeadCache", "Proposer", "RowCache",
           "SpecContext", "TargetModel", "rope"]

#: batch sizes :class:`BatchGraphs` captures (a batch takes the smallest that holds it)
GRAPH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def rope(x: Any, positions: Any, theta: float) -> Any:
    """Rotate-half RoPE over the last dimension of ``x`` [T, heads, D] at ``positions`` [T]
    (computed in float32, returned in ``x``'s dtype)."""
    import torch

    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :].repeat(1, 1, 2), ang.sin()[:, None, :].repeat(1, 1, 2)
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class HeadCache:
    """A draft head's cache for one request: ``caches[layer] = [k, v]`` ([S, Hkv, D], contiguous,
    grown by concatenation) and ``fed``, the verified tokens the head has read."""

    __slots__ = ("caches", "fed")

    def __init__(self, layers: int, device: Any, dtype: Any) -> None:
        import torch

        empty = torch.empty(0, device=device, dtype=dtype)
        self.caches = [[empty, empty] for _ in range(layers)]
        self.fed = 0

    def cut(self, n: int) -> None:
        """Keep the first ``n`` positions of every layer."""
        for c in self.caches:
            c[0], c[1] = c[0][:n], c[1][:n]


class RowCache:
    """A draft head's K/V for every running request at once: per layer ``k``, ``v``
    [rows + 1, cap, kv_heads, head_dim], request row ``r`` holding position ``p`` at
    ``[r, p]``; the last row (:attr:`scratch`) takes the writes of padding tokens. Rows and
    ``cap`` grow (doubling, contents kept) as requests and sequences do; ``version`` counts the
    reallocations (graphs captured on the old buffers must be captured again). ``fed[row]``:
    the verified positions the row holds."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, device: Any, dtype: Any,
                 rows: int = 8, cap: int = 256) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.device, self.dtype = device, dtype
        self.rows, self.cap, self.version = 0, 0, 0
        self.k: list[Any] = []
        self.v: list[Any] = []
        self.free: list[int] = []
        self.owner: dict[Any, int] = {}
        self.fed: dict[int, int] = {}
        self.grow(rows, cap)

    @property
    def scratch(self) -> int:
        return self.rows

    def grow(self, rows: int, cap: int) -> None:
        """At least ``rows`` request rows and ``cap`` positions per row."""
        import torch

        new_rows, new_cap = max(self.rows, 1), max(self.cap, 1)
        while new_rows < rows:
            new_rows *= 2
        while new_cap < cap:
            new_cap *= 2
        if (new_rows, new_cap) == (self.rows, self.cap):
            return
        shape = (new_rows + 1, new_cap, self.kv_heads, self.head_dim)
        for buf in (self.k, self.v):
            for i in range(self.layers):
                fresh = torch.zeros(shape, device=self.device, dtype=self.dtype)
                if i < len(buf):
                    fresh[:self.rows, :self.cap] = buf[i][:self.rows]
                    buf[i] = fresh
                else:
                    buf.append(fresh)
        self.free = list(range(new_rows - 1, self.rows - 1, -1)) + self.free
        self.rows, self.cap = new_rows, new_cap
        self.version += 1

    def span(self, need: int, least: int = 256) -> int:
        """The key span a batched forward attends over to reach position ``need - 1``: the
        smallest power of two from ``least`` that holds it (fewer distinct shapes, so fewer
        graphs); ``cap`` grows to hold it."""
        span = least
        while span < need:
            span *= 2
        self.grow(self.rows, span)
        return span

    def row(self, key: Hashable) -> int:
        """The row of ``key`` (taken when it has none; the rows grow when every one is)."""
        r = self.owner.get(key)
        if r is None:
            if not self.free:
                self.grow(self.rows * 2, self.cap)
            r = self.owner[key] = self.free.pop()
            self.fed[r] = 0
        return r

    def release(self, key: Hashable) -> None:
        r = self.owner.pop(key, None)
        if r is not None:
            self.fed.pop(r, None)
            self.free.append(r)


class BatchGraphs:
    """CUDA graphs of ``fn(*tensors, *extra)``, a function of tensors whose first dimension is
    the batch that returns a tuple of such tensors: captured on first use per batch bucket
    (:data:`GRAPH_BUCKETS`), the tensors' other dimensions and dtypes, and ``extra``. A run
    copies the tensors into the graph's inputs, fills the padding rows with ``pad`` (one value
    per tensor), replays, and returns the outputs' real rows: views that the graph's next
    replay overwrites. Batches beyond the last bucket run ``fn`` eagerly. With ``cache`` (a
    :class:`RowCache` that ``fn`` reads and writes), the graphs are dropped when it is
    reallocated (they were captured on its old buffers)."""

    def __init__(self, fn: Any, cache: RowCache | None = None) -> None:
        self.fn, self.cache = fn, cache
        self.graphs: dict[tuple, tuple[Any, list[Any], tuple]] = {}
        self.pool: Any = None
        self.replays = 0
        self._version = cache.version if cache is not None else 0

    def run(self, tensors: Sequence[Any], pad: Sequence[Any], extra: tuple = ()) -> tuple:
        n = tensors[0].shape[0]
        bucket = next((b for b in GRAPH_BUCKETS if b >= n), None)
        if bucket is None:
            return self.fn(*tensors, *extra)
        if self.cache is not None and self.cache.version != self._version:
            self.graphs.clear()
            self._version = self.cache.version
        key = (bucket, extra, tuple((tuple(t.shape[1:]), t.dtype) for t in tensors))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(bucket, tensors, pad, extra)
        graph, static, out = entry
        for buf, t, fill in zip(static, tensors, pad):
            buf[:n] = t
            buf[n:] = fill
        graph.replay()
        self.replays += 1
        return tuple(o[:n] for o in out)

    def _capture(self, bucket: int, tensors: Sequence[Any], pad: Sequence[Any],
                 extra: tuple) -> tuple[Any, list[Any], tuple]:
        import torch

        from engine.runtime.cuda_graph import capture_graph

        static = [torch.full((bucket, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
                  for t, fill in zip(tensors, pad)]
        graph, out = capture_graph(lambda: self.fn(*static, *extra), self.pool)
        self.pool = graph.pool()
        return graph, static, out


@dataclass
class Draft:
    """Draft tokens for one request: node ``i`` carries ``token_ids[i]`` and hangs below node
    ``parents[i]`` (an earlier node, or ``-1``: the request's last verified token). A chain has
    ``parents[i] == i - 1``. Siblings must carry distinct tokens."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    @classmethod
    def chain_with_siblings(cls, chain: Sequence[int],
                            siblings: Sequence[Sequence[int]]) -> "Draft":
        """A chain whose node i also has ``siblings[i]`` (alternatives at its depth, under its
        parent) as leaves; an alternative equal to the chain's token there is left out."""
        tokens: list[int] = []
        parents: list[int] = []
        prev = -1
        for tok, alts in zip(chain, siblings):
            tokens.append(tok)
            parents.append(prev)
            here = len(tokens) - 1
            for alt in alts:
                if alt != tok:
                    tokens.append(alt)
                    parents.append(prev)
            prev = here
        return cls(tokens, parents)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "Draft":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of each node (a child of the root has depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def truncated(self, max_nodes: int, max_depth: int) -> "Draft":
        """The first ``max_nodes`` nodes no deeper than ``max_depth`` (a node whose parent is
        dropped is dropped too); node order is kept."""
        keep: dict[int, int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        for i, (tok, par, depth) in enumerate(zip(self.token_ids, self.parents, self.depths())):
            if len(tokens) >= max_nodes:
                break
            if depth > max_depth or (par >= 0 and par not in keep):
                continue
            keep[i] = len(tokens)
            tokens.append(tok)
            parents.append(keep[par] if par >= 0 else -1)
        return Draft(tokens, parents)


class DraftModel(ABC):
    """A second causal LM with its own KV pool, served by the core (STANDALONE drafts).

    Sequences are named by any hashable key (the request object). Each keeps the KV of its
    first ``length(key)`` tokens; :meth:`extend` first cuts a sequence back to ``start`` tokens
    (freeing the rest), then appends ``tokens`` and returns the logits after the last of them.
    """

    vocab_size: int

    @abstractmethod
    def extend(self, items: Sequence[tuple[Hashable, int, Sequence[int]]]) -> Any:
        """``items``: ``(key, start, tokens)``; float32 logits ``[len(items), vocab]`` (a torch
        tensor), one row per item, after its last token. One forward for all items."""

    @abstractmethod
    def length(self, key: Hashable) -> int:
        """Tokens of ``key`` in the draft KV (0 when unknown)."""

    @abstractmethod
    def release(self, key: Hashable) -> None:
        """Free ``key``'s KV (a no-op when it holds none)."""


class TargetModel(ABC):
    """Read access to the target model for drafts that reuse its parts (EAGLE, NEXTN).

    Attributes: ``hidden_size``, ``vocab_size``, ``num_layers``, ``dtype``, ``device``,
    ``rms_norm_eps``.
    """

    hidden_size: int
    vocab_size: int
    num_layers: int
    dtype: Any
    device: Any
    rms_norm_eps: float

    @abstractmethod
    def embed(self, token_ids: Any) -> Any:
        """The target's input embeddings of ``token_ids`` ([T] -> [T, H])."""

    @abstractmethod
    def logits(self, hidden: Any) -> Any:
        """The target's LM head over hidden states ([N, H] -> [N, V] float32)."""

    @abstractmethod
    def capture(self, layers: Sequence[int] = ()) -> int:
        """Keep, from now on, each target token's features: its final normed hidden state
        (``layers`` empty) or the inputs of the given layers concatenated in layer order
        (EAGLE3; index ``num_layers`` is the final normed state, as the last of transformers'
        ``hidden_states``). Call once, at construction; returns the feature width."""

    @abstractmethod
    def features(self, request: Any, start: int, end: int) -> Any:
        """Features ``[end - start, width]`` of the request's tokens ``start .. end - 1``; they
        must be in the target's KV (``end <= request.kv_len``). Tokens of a cached prefix
        have theirs too (features live with the KV slots)."""


    def adapter(self, path: str | None, *, rank: int = 8, seed: int = 0) -> Any:
        """A LoRA adapter over the target's linear layers, for :meth:`run_block`: the PEFT
        checkpoint at ``path``, or random weights of ``rank`` when ``path`` is None (for
        ``--speculative-draft-load-format dummy``). ConfigError when it cannot be applied."""
        raise NotImplementedError(f"{type(self).__name__} has no adapters")

    def prepare_block(self, width: int, *, adapter: Any = None, plain_rows: int = 0) -> None:
        """Get ready for :meth:`run_block` calls with blocks of ``width`` tokens (and this
        adapter and ``plain_rows``): on a GPU their CUDA graphs are captured now, at start-up,
        not at the first draft. Default: nothing."""

    def run_block(self, requests: Sequence[Any], blocks: Sequence[Sequence[int]], *,
                  adapter: Any = None, plain_rows: int = 0) -> list[Any]:
        """Run the target itself over ``blocks[i]`` placed right after request ``i``'s KV
        (positions ``kv_len ..``, causal, seeing the request's context) and return each
        block's float32 logits ``[len(block), vocab]`` (``None`` for a request whose block
        does not fit its context or the KV pool this step). Nothing is kept: the blocks' K/V
        go into the slots this step's verify forward writes again. With ``adapter`` (from
        :meth:`adapter`), its deltas are added on every row of a block but the first
        ``plain_rows`` (those run as the target alone). Served while a verify step drafts
        (inside :meth:`Proposer.propose`); one forward for all blocks."""
        raise NotImplementedError(f"{type(self).__name__} does not run blocks")


@dataclass
class SpecContext:
    """What the core gives a proposer's hook (see the module docstring)."""

    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    device: Any = None
    target: TargetModel | None = None
    #: builds the ``--speculative-draft-model-path`` model (raises ConfigError when there is
    #: none, its vocabulary differs from the target's, or it fails to load)
    draft_loader: Any = None

    def load_draft_model(self) -> DraftModel:
        from engine.errors import ConfigError

        if self.draft_loader is None:
            raise ConfigError("this server cannot load a draft model")
        return self.draft_loader()


class Proposer(ABC):
    """Drafts tokens for the running requests, once per decode step."""

    #: verify width per request: the last verified token plus at most this minus one nodes
    num_draft_tokens: int = 4
    #: True when drafts may branch (needs an attention backend that verifies trees)
    drafts_trees: bool = False

    @abstractmethod
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        """One :class:`Draft` per request (empty: none this step), from each request's prompt
        and output so far (``origin_input_ids``, ``output_ids``). The core cuts a draft to the
        request's remaining tokens and context; nodes past the width are dropped."""

    def on_verified(self, request: Any, accepted: int) -> None:
        """Told how many nodes of the request's last draft were accepted (default: nothing)."""

    def release(self, request: Any) -> None:
        """The request left the running batch (finished, aborted or retracted): drop its
        state (draft KV...). Default: nothing."""

    def describe(self) -> str:
        """One line for the start-up log."""
        return f"{type(self).__name__}: up to {self.num_draft_tokens - 1} draft tokens" + (
            " (tree)" if self.drafts_trees else " (chain)")

"""The DSpark draft: a DFlash backbone plus a sequential Markov head (plain PyTorch).

The backbone (``engine_spec_dflash.model``) turns the block ``[last token, mask x gamma]`` into
hidden states in one forward; the target's LM head gives each of the ``gamma`` draft rows its
base logits. The Markov head then drafts left to right: row ``j``'s logits are its base logits
plus a bias computed from the token before it (the last verified token for row 0, else the
token just drafted), so the block is semi-autoregressive at the cost of a rank-``r`` product per
row. The four published heads:

* ``vanilla``: ``bias = W2 E[prev]`` (``markov_w1``: an embedding [V, r]; ``markov_w2``:
  a linear r -> V, no bias);
* ``gated``: ``bias = W2 (g * E[prev])``, ``g = sigmoid(gate_proj([h_j, E[prev]]))``;
* ``rnn``: a gated recurrent state over the block: ``z = [s, E[prev], h_j]``, ``joint_proj``
  gives gate, candidate and output; ``s <- g s + (1 - g) tanh(c)``; ``bias = W2 tanh(o)``;
* ``carh``: ``u = silu(LayerNorm(E[prev] + hidden_proj(h_j) + depth[j]))``,
  ``bias = W2 (sigmoid(gate_proj(u)) * u)``.

``h_j`` is the backbone's final (normed) hidden state of draft row ``j``. The confidence head
(compact ragged verify) is not used: the whole block is verified (static mode).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine_spec_dflash.model import DFlashConfig, DFlashHead

HEAD_TYPES = ("vanilla", "gated", "rnn", "carh")


class MarkovHead(nn.Module):
    def __init__(self, kind: str, vocab: int, rank: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)
        elif kind == "carh":
            self.hidden_proj = nn.Linear(hidden, rank, bias=False)
            self.depth_embedding = nn.Embedding(depth, rank)
            self.fusion_norm = nn.LayerNorm(rank)
            self.gate_proj = nn.Linear(rank, 1)

    def _bias(self, prev: torch.Tensor, h: torch.Tensor, j: int,
              state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.markov_w1(prev)
        if self.kind == "vanilla":
            return self.markov_w2(emb), state
        if self.kind == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([h, emb], -1)))
            return self.markov_w2(gate * emb), state
        if self.kind == "rnn":
            g, c, o = self.joint_proj(torch.cat([state, emb, h], -1)).chunk(3, -1)
            g = torch.sigmoid(g)
            state = g * state + (1.0 - g) * torch.tanh(c)
            return self.markov_w2(torch.tanh(o)), state
        depth = self.depth_embedding.weight[j]
        u = F.silu(self.fusion_norm(emb + self.hidden_proj(h) + depth))
        return self.markov_w2(torch.sigmoid(self.gate_proj(u)) * u), state

    def greedy(self, base: torch.Tensor, last: torch.Tensor, hidden: torch.Tensor
               ) -> torch.Tensor:
        """Draft tokens [B, gamma], left to right: ``base`` [B, gamma, V] float32 base logits,
        ``hidden`` [B, gamma, H] the rows' hidden states, ``last`` [B] the token before row
        0."""
        dtype = self.markov_w1.weight.dtype
        prev = last
        state = torch.zeros(base.shape[0], self.rank, device=base.device, dtype=dtype)
        out = []
        for j in range(base.shape[1]):
            bias, state = self._bias(prev, hidden[:, j].to(dtype), j, state)
            prev = (base[:, j] + bias.float()).argmax(-1)
            out.append(prev)
        return torch.stack(out, 1)


class DSparkHead(DFlashHead):
    def __init__(self, c: DFlashConfig, kind: str, rank: int, vocab: int) -> None:
        super().__init__(c)
        self.markov_head = MarkovHead(kind, vocab, rank, c.hidden_size, c.block_size)


def markov_settings(raw: dict[str, Any]) -> tuple[str, int]:
    """(head type, rank) from a DSpark config.json dict: the ``dspark_`` prefixed fields, then
    ``dspark_config``, ``dflash_config`` and the top level."""
    def get(name: str, default: Any = None) -> Any:
        for where in (raw.get(f"dspark_{name}"), (raw.get("dspark_config") or {}).get(name),
                      (raw.get("dflash_config") or {}).get(name), raw.get(name)):
            if where is not None:
                return where
        return default
    return str(get("markov_head_type", "vanilla")).lower(), int(get("markov_rank", 0) or 0)


def normalized(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with DSpark's own spellings of the block size, noise token and target layers
    moved to where the DFlash reader looks (``dflash_config``)."""
    out = dict(raw)
    dflash = dict(raw.get("dflash_config") or {})
    ds = raw.get("dspark_config") or {}
    for name, spellings in (
            ("block_size", ("dspark_block_size",)),
            ("mask_token_id", ("dspark_noise_token_id", "noise_token_id")),
            ("target_layer_ids", ("dspark_target_layer_ids",))):
        for s in spellings:
            if raw.get(s) is not None:
                dflash[name] = raw[s]
                break
        else:
            if ds.get(name) is not None:
                dflash[name] = ds[name]
    dflash.setdefault("block_size", raw.get("block_size", 7))
    out["dflash_config"] = dflash
    return out

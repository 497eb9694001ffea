"""NGRAM drafting: the request's own text and every other request's, indexed by token; a
tree of the continuations of the best matches.

* :class:`SharedIndex` maps each token to its occurrences in the text (prompt and output) of
  every request, live or released (``capacity`` bounds the released text kept). A match is an
  occurrence of the request's last token whose preceding tokens equal the request's last ones
  too, ``min_w`` to ``max_w`` in all; its continuation is what followed there, up to
  ``max_depth`` tokens. Adding a token is one list append, so a long prompt costs next to
  nothing to take in.
* the draft is cut per request to about twice its recent accepted length plus one, and a
  request whose drafts keep failing drafts only every few steps (see ``EMA_WEIGHT``).
* the tree: one branch per distinct next token, at most a breadth that shrinks as the longest
  match grows; branches ordered by match length, then the longest continuation, then recency
  (``BFS``), or by how often the next token follows (``PROB``); the first branch is drafted
  as deep as the budget allows after reserving a node for every other one.
"""

from __future__ import annotations

from typing import Any, Sequence

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, Proposer, SpecContext

MAX_CANDIDATES = 64  #: latest occurrences of the last token examined per draft
#: per request, the draft is cut to about twice its recent accepted length (an exponential
#: average with weight ``EMA_WEIGHT`` on the last verify, starting at ``START_PACE``) plus one;
#: below ``IDLE_BELOW`` accepted tokens per verify it drafts only every ``PROBE_EVERY``-th
#: step. A verify costs more than a decode step where the device is compute-bound (CPU: about
#: +15 % per draft token), so text that n-grams do not predict must not draft much
EMA_WEIGHT, START_PACE, IDLE_BELOW, PROBE_EVERY = 0.5, 1.0, 0.5, 6


class RequestText:
    """One request's tokens (prompt, then output) and when each came in."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.stamps: list[int] = []  #: the shared index's clock when each token came in

    def match_length(self, pos: int, suffix: list[int], max_w: int) -> int:
        """How many tokens up to ``pos`` equal the end of ``suffix`` (at most ``max_w``)."""
        toks = self.tokens
        n, last = 0, len(suffix) - 1
        while n < max_w and pos - n >= 0 and n <= last and toks[pos - n] == suffix[last - n]:
            n += 1
        return n


class SharedIndex:
    """The text of every request, live or released, with a map from each token to its
    occurrences in all of them (most recent last): a request matches its own text and the
    others' alike. Adding a token costs one list append, whatever the branch length.
    ``capacity`` bounds the tokens of released requests kept (the least recently released go
    first; a live request's text always stays)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.where: dict[int, list[tuple[RequestText, int]]] = {}
        self.clock = 0
        self.released: dict[RequestText, None] = {}  #: released texts, oldest first
        self.kept = 0  #: tokens of the released texts
        self.entries = 0  #: occurrences in ``where``
        self._dead = 0  #: occurrences of evicted texts still in ``where``

    def extend(self, text: RequestText, tokens: Sequence[int]) -> None:
        where, start = self.where, len(text.tokens)
        for pos, tok in enumerate(tokens, start):
            self.clock += 1
            text.tokens.append(tok)
            text.stamps.append(self.clock)
            where.setdefault(tok, []).append((text, pos))
        self.entries += len(tokens)

    def release(self, text: RequestText) -> None:
        self.released[text] = None
        self.kept += len(text.tokens)
        while self.kept > self.capacity and self.released:
            old = next(iter(self.released))
            del self.released[old]
            self.kept -= len(old.tokens)
            self._dead += len(old.tokens)
            old.tokens, old.stamps = [], []  # its occurrences now point past its end
        if 2 * self._dead > self.entries:  # drop them once they are half of the map
            self.where = {tok: kept for tok, occ in self.where.items()
                          if (kept := [(t, p) for t, p in occ if p < len(t.tokens)])}
            self.entries -= self._dead
            self._dead = 0

    def matches(self, own: RequestText, min_w: int, max_w: int
                ) -> list[tuple[int, RequestText, int]]:
        """``(match length, text, position)`` of the latest occurrences (at most
        :data:`MAX_CANDIDATES`) of ``own``'s last token, in any text, that something
        follows and whose ``min_w``.. ``max_w`` tokens up to there equal ``own``'s last."""
        toks = own.tokens
        if not toks:
            return []
        last = len(toks) - 1
        found = []
        for text, pos in reversed(self.where.get(toks[last], [])[-MAX_CANDIDATES - 1:]):
            if pos + 1 >= len(text.tokens) or (text is own and pos >= last):
                continue
            n = text.match_length(pos, toks, max_w)
            if n >= min_w:
                found.append((n, text, pos))
        return found


class _Tree:
    """A draft under construction (node ``i + 1``; node 0 is the root)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.kids: dict[int, dict[int, int]] = {}

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def child(self, parent: int, token: int) -> int | None:
        """The node below ``parent`` carrying ``token``, made if the budget allows."""
        at = self.kids.setdefault(parent, {})
        node = at.get(token)
        if node is None:
            if self.full:
                return None
            self.tokens.append(token)
            self.parents.append(parent - 1)
            node = at[token] = len(self.tokens)
        return node

    def add_path(self, tokens: Sequence[int], limit: int) -> None:
        node = 0
        for tok in tokens[:limit]:
            nxt = self.child(node, tok)
            if nxt is None:
                return
            node = nxt


class NgramProposer(Proposer):
    """See the module docstring; options are the plugin's ``--speculative-ngram-*``."""

    def __init__(self, options: Any, context: SpecContext) -> None:
        self.min_breadth = int(options["speculative_ngram_min_bfs_breadth"])
        self.max_breadth = int(options["speculative_ngram_max_bfs_breadth"])
        self.match_type = str(options["speculative_ngram_match_type"]).upper()
        self.max_depth = int(options["speculative_ngram_max_trie_depth"])
        capacity = int(options["speculative_ngram_capacity"])
        self.min_w = int(options["speculative_ngram_min_match_window_size"])
        self.max_w = int(options["speculative_ngram_max_match_window_size"])
        if not 1 <= self.min_breadth <= self.max_breadth:
            raise ConfigError("--speculative-ngram-min-bfs-breadth and -max-bfs-breadth: need "
                              f"1 <= min <= max (got {self.min_breadth}, {self.max_breadth})")
        if not 1 <= self.min_w <= self.max_w:
            raise ConfigError("--speculative-ngram-min/max-match-window-size: need "
                              f"1 <= min <= max (got {self.min_w}, {self.max_w})")
        if self.match_type not in ("BFS", "PROB"):
            raise ConfigError(f"--speculative-ngram-match-type {self.match_type}: BFS or PROB")
        if self.max_depth < 2 or capacity < 1:
            raise ConfigError("--speculative-ngram-max-trie-depth must be at least 2 and "
                              "--speculative-ngram-capacity at least 1")
        self.num_draft_tokens = context.num_draft_tokens or 12
        self.drafts_trees = self.max_breadth > 1 and self.num_draft_tokens > 2
        self.index = SharedIndex(capacity)
        self._state: dict[Any, RequestText] = {}
        #: per request: [accepted tokens per verify (average), steps since the last draft,
        #: nodes of the last draft]
        self._pace: dict[Any, list[float]] = {}

    def describe(self) -> str:
        shape = f"trees of breadth {self.min_breadth}..{self.max_breadth}" \
            if self.drafts_trees else "chains"
        return (f"n-gram drafts of up to {self.num_draft_tokens - 1} tokens ({shape}, "
                f"{self.match_type}, windows {self.min_w}..{self.max_w}, branches of up to "
                f"{self.max_depth} tokens)")

    # ------------------------------------------------------------------ state

    def _sync(self, req: Any) -> RequestText:
        text = self._state.get(req)
        if text is None:
            text = self._state[req] = RequestText()
        n = len(text.tokens)
        prompt = req.origin_input_ids
        new = (prompt[n:] + req.output_ids) if n < len(prompt) else \
            req.output_ids[n - len(prompt):]
        if new:
            self.index.extend(text, new)
        return text

    def release(self, request: Any) -> None:
        text = self._state.pop(request, None)
        if text is not None:  # its text stays for the others, within the capacity
            self.index.release(text)
        self._pace.pop(request, None)

    def on_verified(self, request: Any, accepted: int) -> None:
        pace = self._pace.get(request)
        if pace is not None and pace[2] > 0:
            pace[0] = (1 - EMA_WEIGHT) * pace[0] + EMA_WEIGHT * accepted
            pace[2] = 0

    def _budget(self, req: Any) -> int:
        """Draft nodes for ``req`` this step (0: skip), from its recent acceptance."""
        width = self.num_draft_tokens - 1
        pace = self._pace.setdefault(req, [START_PACE, 0.0, 0.0])
        pace[1] += 1
        if pace[0] < IDLE_BELOW and pace[1] < PROBE_EVERY:
            return 0
        pace[1] = 0
        return max(1, min(width, int(2 * pace[0]) + 1))

    # ------------------------------------------------------------------ drafting

    def _breadth(self, match_len: int) -> int:
        span = max(1, self.max_w - self.min_w)
        frac = min(1.0, max(0.0, (match_len - self.min_w) / span))
        return max(self.min_breadth,
                   round(self.max_breadth - (self.max_breadth - self.min_breadth) * frac))

    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        return [self._propose(req) for req in requests]

    def _propose(self, req: Any) -> Draft:
        own = self._sync(req)
        budget = self._budget(req)
        if budget <= 0:
            return Draft()
        matches = self.index.matches(own, self.min_w, self.max_w)
        if not matches:
            return Draft()
        counts: dict[int, int] = {}
        for _, text, pos in matches:
            nxt = text.tokens[pos + 1]
            counts[nxt] = counts.get(nxt, 0) + 1
        if self.match_type == "BFS":  # longest match, then the most continuation, recent
            matches.sort(key=lambda m: (-m[0], -min(len(m[1].tokens) - 1 - m[2], budget),
                                        -m[1].stamps[m[2]]))
        else:  # the most frequent next token, then the longest match, recent
            matches.sort(key=lambda m: (-counts[m[1].tokens[m[2] + 1]], -m[0],
                                        -m[1].stamps[m[2]]))
        breadth = self._breadth(max(m[0] for m in matches)) if self.drafts_trees else 1
        branches: list[tuple[RequestText, int]] = []
        seen: set[int] = set()
        for _, text, pos in matches:
            if text.tokens[pos + 1] not in seen:
                seen.add(text.tokens[pos + 1])
                branches.append((text, pos))
                if len(branches) >= breadth:
                    break
        tree = _Tree(budget)
        depth = self.max_depth
        for k, (text, pos) in enumerate(branches):  # the first as deep as the rest allow
            share = budget - (len(branches) - 1) if k == 0 else \
                max(1, (budget - len(tree.tokens)) // len(branches))
            tree.add_path(text.tokens[pos + 1:pos + 1 + depth], share)
        self._pace[req][2] = len(tree.tokens)
        return Draft(tree.tokens, tree.parents)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return NgramProposer(options, context)

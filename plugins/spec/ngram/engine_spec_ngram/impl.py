"""NGRAM drafting: the request's own matcher, a shared capacity-bounded trie, a BFS tree.

* :class:`OwnMatcher` indexes one request's tokens by value; a match is an earlier position
  whose preceding tokens equal the request's last ``w`` tokens (``w`` from the longest window
  down to the shortest); its continuation is what followed there.
* :class:`NgramTrie` holds every n-gram (up to ``max_depth`` tokens) of every request, with a
  count and a recency stamp per node; ``capacity`` bounds its nodes (least recently used
  subtrees are dropped when it overflows).
* the tree is cut per request to about twice its recent accepted length plus one, and a
  request whose drafts keep failing drafts only every few steps (see ``EMA_WEIGHT``).
* the draft merges them into one tree: the own matches first (the best one as a
  chain as deep as the budget allows after reserving one node per other branch), then the trie
  below the longest matched suffix, level by level with a breadth that shrinks as the match
  grows, children ordered by recency (``BFS``) or count (``PROB``).
"""

from __future__ import annotations

from typing import Any, Sequence

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, Proposer, SpecContext

MAX_CANDIDATES = 64  #: earlier positions of the last token examined by the own matcher
#: per request, the draft is cut to about twice its recent accepted length (an exponential
#: average with weight ``EMA_WEIGHT`` on the last verify, starting at ``START_PACE``) plus one;
#: below ``IDLE_BELOW`` accepted tokens per verify it drafts only every ``PROBE_EVERY``-th
#: step. A verify costs more than a decode step where the device is compute-bound (CPU: about
#: +15 % per draft token), so text that n-grams do not predict must not draft much
EMA_WEIGHT, START_PACE, IDLE_BELOW, PROBE_EVERY = 0.5, 1.0, 0.5, 6


class _Node:
    __slots__ = ("children", "count", "stamp")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0
        self.stamp = 0


class NgramTrie:
    """n-grams of up to ``max_depth`` tokens; at most about ``capacity`` nodes."""

    def __init__(self, max_depth: int, capacity: int) -> None:
        self.max_depth, self.capacity = max_depth, capacity
        self.root = _Node()
        self.size = 0
        self.clock = 0

    def cursors(self) -> list[_Node]:
        return []

    def advance(self, cursors: list[_Node], token: int) -> list[_Node]:
        """Insert ``token`` after each suffix the ``cursors`` stand for (and as a 1-gram);
        returns the cursors after it (suffixes of up to ``max_depth - 1`` tokens)."""
        self.clock += 1
        out: list[_Node] = []
        for node in [self.root, *cursors]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
                self.size += 1
            child.count += 1
            child.stamp = self.clock
            out.append(child)
        if len(out) >= self.max_depth:
            out.pop()  # the longest one reached the depth limit
        if self.size > self.capacity:
            self._evict()
        return out

    def _evict(self) -> None:
        """Drop the least recently used subtrees until a quarter of the capacity is free."""
        target = self.capacity * 3 // 4
        stamps = sorted(c.stamp for c in self.root.children.values())
        for cut in stamps:
            if self.size <= target:
                break
            for tok, child in list(self.root.children.items()):
                if child.stamp <= cut:
                    self.size -= _subtree_size(child)
                    del self.root.children[tok]
        if self.size > target:  # one huge recent subtree: start over
            self.root, self.size = _Node(), 0

    def find(self, suffix: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in suffix:
            node = node.children.get(tok)
            if node is None:
                return None
        return node


def _subtree_size(node: _Node) -> int:
    n, stack = 0, [node]
    while stack:
        cur = stack.pop()
        n += 1
        stack.extend(cur.children.values())
    return n


class OwnMatcher:
    """One request's tokens, indexed by value."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.where: dict[int, list[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for tok in tokens:
            self.where.setdefault(tok, []).append(len(self.tokens))
            self.tokens.append(tok)

    def matches(self, min_w: int, max_w: int) -> list[tuple[int, int]]:
        """``(match length, position)`` of earlier occurrences of the last token whose
        preceding tokens match too (at least ``min_w`` in all), best first: longest, then
        most recent."""
        toks = self.tokens
        last = len(toks) - 1
        if last < 1:
            return []
        found = []
        positions = self.where.get(toks[last], [])
        for pos in reversed(positions[-MAX_CANDIDATES - 1:]):
            if pos >= last:
                continue
            n = 1
            while n < max_w and pos - n >= 0 and toks[pos - n] == toks[last - n]:
                n += 1
            if n >= min_w:
                found.append((n, pos))
        found.sort(key=lambda m: (-m[0], -m[1]))
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
        self.trie = NgramTrie(self.max_depth, capacity)
        self._state: dict[Any, tuple[OwnMatcher, list[Any]]] = {}
        #: per request: [accepted tokens per verify (average), steps since the last draft,
        #: nodes of the last draft]
        self._pace: dict[Any, list[float]] = {}

    def describe(self) -> str:
        shape = f"trees of breadth {self.min_breadth}..{self.max_breadth}" \
            if self.drafts_trees else "chains"
        return (f"n-gram drafts of up to {self.num_draft_tokens - 1} tokens ({shape}, "
                f"{self.match_type}, windows {self.min_w}..{self.max_w}, trie depth "
                f"{self.max_depth})")

    # ------------------------------------------------------------------ state

    def _sync(self, req: Any) -> OwnMatcher:
        state = self._state.get(req)
        if state is None:
            state = self._state[req] = (OwnMatcher(), [])
        own, cursors = state
        n = len(own.tokens)
        prompt = req.origin_input_ids
        new = (prompt[n:] + req.output_ids) if n < len(prompt) else \
            req.output_ids[n - len(prompt):]
        own.extend(new)
        for tok in new:
            cursors[:] = self.trie.advance(cursors, tok)
        return own

    def release(self, request: Any) -> None:
        self._state.pop(request, None)
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
        tree = _Tree(budget)
        toks = own.tokens
        depth = self.max_depth
        matches = own.matches(self.min_w, self.max_w)
        if matches:
            branches: list[int] = []
            seen: set[int] = set()
            counts: dict[int, int] = {}
            for _, pos in matches:
                counts[toks[pos + 1]] = counts.get(toks[pos + 1], 0) + 1
            breadth = self._breadth(matches[0][0]) if self.drafts_trees else 1
            last = len(toks) - 1
            if self.match_type == "BFS":  # longest match, then the most continuation, recent
                ordered = sorted(matches, key=lambda m: (-m[0], -min(last - m[1], budget),
                                                         -m[1]))
            else:
                ordered = sorted(matches, key=lambda m: (-counts[toks[m[1] + 1]], -m[0], -m[1]))
            for _, pos in ordered:
                if toks[pos + 1] not in seen:
                    seen.add(toks[pos + 1])
                    branches.append(pos)
                if len(branches) >= breadth:
                    break
            first = branches[0]
            tree.add_path(toks[first + 1:first + 1 + depth], budget - (len(branches) - 1))
            for pos in branches[1:]:
                tree.add_path(toks[pos + 1:pos + 1 + depth], max(1, (budget - len(tree.tokens))
                                                                 // len(branches)))
        if not tree.full:
            self._from_trie(tree, toks)
        if not tree.tokens:
            return Draft()
        self._pace[req][2] = len(tree.tokens)
        return Draft(tree.tokens, tree.parents)

    def _from_trie(self, tree: _Tree, toks: list[int]) -> None:
        """Fill the tree from the trie below the longest suffix it holds (BFS by level)."""
        longest = min(self.max_w, self.max_depth - 1, len(toks))
        for w in range(longest, self.min_w - 1, -1):
            node = self.trie.find(toks[len(toks) - w:])
            if node is not None and node.children:
                break
        else:
            return
        breadth = self._breadth(w) if self.drafts_trees else 1
        key = (lambda n: n[1].stamp) if self.match_type == "BFS" else (lambda n: n[1].count)
        frontier = [(node, 0)]
        for _ in range(self.max_depth - w):
            options = [(kid_tok, kid, at) for trie_node, at in frontier
                       for kid_tok, kid in trie_node.children.items()]
            if not options:
                return
            options.sort(key=lambda o: key((o[0], o[1])), reverse=True)
            frontier = []
            for tok, kid, at in options[:breadth]:
                made = tree.child(at, tok)
                if made is None:
                    return
                frontier.append((kid, made))


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return NgramProposer(options, context)

"""Grammar backends (the ``grammar`` family): constrained decoding.

A request may carry one constraint, a :class:`GrammarSpec`: a JSON schema, any JSON object, a
regular expression, an EBNF grammar, tool calls (``tool_choice`` ``required`` or a named
function, in the tool-call parser's format) or structural tags (see :data:`KINDS`). The server compiles it with the selected backend
before the request is queued, and every step of that request the backend's matcher says which
tokens may come next; the sampler sets the others' logits to ``-inf``.

Contract of a backend (what ``engine_create_grammar_backend`` returns):

* ``kinds``: the :data:`KINDS` it compiles; a spec of another kind is refused with
  :class:`InvalidGrammar` naming the backend (the server answers HTTP 400).
* ``compile(spec)`` returns a compiled grammar: immutable, shared by every request with the same
  spec (the server caches it by spec, LRU), called from a worker thread of the server (never
  the scheduler thread), possibly from several at once. An invalid spec raises
  :class:`InvalidGrammar` with the library's own message.
* ``matcher(compiled)`` returns a fresh :class:`GrammarMatcher` for one sequence, also called
  from a worker thread; the matcher is then used by the scheduler thread alone.

Contract of a matcher (its state is the tokens accepted so far):

* ``fill_bitmask(bitmask, index)`` writes the allowed next tokens into row ``index`` of an
  ``int32`` CPU tensor from :func:`allocate_token_bitmask`: bit ``t % 32`` of word ``t // 32``
  is set when token ``t`` may come next. When the constraint is complete, the end-of-sequence
  tokens are allowed (and nothing else, unless the constraint may continue). A row with no bit
  set is a dead end: the server ends that request with ``finish_reason`` ``abort``.
* ``accept(token)`` advances by one token; returns False (and is then unusable) when the token
  is not allowed.
* ``is_terminated()``: the constrained text is complete and nothing but an end-of-sequence token
  may follow (or one was accepted): the server ends the request with ``stop``.
* ``rollback(n)`` undoes the last ``n`` accepted tokens; a library that cannot raises
  ``NotImplementedError``.

The bitmask layout is the one llguidance, xgrammar and outlines-core share, so the helpers
below serve every backend. :func:`apply_token_bitmask_inplace` is the core's: on CPU it unpacks
the words with NumPy (0.07 ms for a 49k vocabulary), where the libraries' own torch helpers
either compile a kernel on first use (llguidance: 19 s, then 12 ms a row on CPU) or loop in
C++ (xgrammar: 0.34 ms a row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: the constraint kinds a request can carry.
#:
#: ``tool_calls`` (``tool_choice`` ``required`` or a named function): the text is JSON
#: ``{"structures": [{"begin": str, "schema": {...}, "end": str, "arguments": "json"}, ...],
#: "parallel": bool, "prefix": str, "separator": str, "suffix": str, "reasoning": null}``, and
#: the output is ``prefix``, one structure (with ``parallel``, one or more separated by
#: ``separator``, default ``"\n"``), ``suffix``; nothing else. A structure is its ``begin``,
#: its value, its ``end``: with ``arguments`` ``"json"`` (the default) a JSON value valid
#: against ``schema``; with ``"kwargs"`` the object's properties as keyword arguments
#: ``name=VALUE, ...`` (declared order, required ones always, values written as JSON), as in a
#: Python call. ``reasoning`` ``{"start": str, "end": str, "open": bool}``: a reasoning section
#: comes first, free text up to ``end`` (``open``: the output starts inside it; else it is
#: optional and opens with ``start``), then optional whitespace, then the calls.
#:
#: ``structural_tag`` (OpenAI/SGLang ``response_format``): the text is JSON
#: ``{"structures": [{"begin": str, "schema": {...} | null, "end": str}, ...],
#: "triggers": [str, ...]}``: free text, in which each occurrence of a trigger starts one of
#: the structures whose ``begin`` starts with it: that ``begin``, a JSON value valid against its
#: ``schema`` (any JSON when null), its ``end``; then free text again.
KINDS = ("json_schema", "json_object", "regex", "ebnf", "tool_calls", "structural_tag")


class InvalidGrammar(ValueError):
    """A constraint the backend cannot compile (bad schema, regex or grammar, or a kind it does
    not support). The message is the backend's own; the server answers HTTP 400 with it."""


@dataclass(frozen=True)
class GrammarSpec:
    """One request's constraint: ``kind`` in :data:`KINDS` and its text (the schema as JSON
    text, the regex, the grammar; empty for ``json_object``). Hashable: the compile cache key."""

    kind: str
    text: str = ""


class GrammarMatcher:
    """One sequence's position in a compiled grammar (see the module docstring)."""

    def fill_bitmask(self, bitmask: "torch.Tensor", index: int) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> bool:
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError

    def rollback(self, n: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot roll back")

    def allowed_tokens(self, vocab_size: int) -> list[int]:
        """The token ids that may come next (from :meth:`fill_bitmask`)."""
        bitmask = allocate_token_bitmask(1, vocab_size)
        self.fill_bitmask(bitmask, 0)
        return allowed_tokens(bitmask[0], vocab_size)


class GrammarBackend:
    """Compiles specs and makes matchers (see the module docstring)."""

    name = "?"
    kinds: tuple[str, ...] = KINDS

    def compile(self, spec: GrammarSpec) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> GrammarMatcher:
        raise NotImplementedError

    def check_kind(self, spec: GrammarSpec) -> None:
        """Raise :class:`InvalidGrammar` when this backend does not compile ``spec.kind``."""
        if spec.kind not in self.kinds:
            raise InvalidGrammar(f"the {self.name} grammar backend does not support "
                                 f"{spec.kind} constraints (it supports "
                                 f"{', '.join(self.kinds) or 'none'})")


def structural_tag_structures(tag: Any) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """(triggers, [(trigger, structure)]) of a ``structural_tag`` spec's JSON object: each
    structure with the trigger its ``begin`` starts with. ``ValueError`` saying what is wrong
    (not an object, no trigger, a ``begin`` starting with no trigger, no structure)."""
    if not isinstance(tag, dict):
        raise ValueError("a structural_tag spec is a JSON object")
    triggers = [t for t in tag.get("triggers") or () if isinstance(t, str) and t]
    if not triggers:
        raise ValueError("structural_tag needs at least one non-empty trigger")
    out = []
    for i, st in enumerate(tag.get("structures") or ()):
        begin = st.get("begin", "")
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structures[{i}].begin {begin!r} starts with no trigger")
        out.append((trigger, st))
    if not out:
        raise ValueError("structural_tag needs at least one structure")
    return triggers, out


def allocate_token_bitmask(batch: int, vocab_size: int) -> "torch.Tensor":
    """An ``int32`` CPU tensor ``[batch, ceil(vocab_size / 32)]`` with every token allowed."""
    import torch

    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _unpack(bitmask: "torch.Tensor", vocab_size: int) -> Any:
    """``bool`` ``[rows, vocab_size]`` NumPy array of a CPU bitmask: True where allowed."""
    import numpy as np

    words = bitmask.reshape(-1, bitmask.shape[-1]).numpy()
    return np.unpackbits(words.view(np.uint8), axis=1, count=vocab_size,
                         bitorder="little").view(np.bool_)


def allowed_tokens(bitmask_row: "torch.Tensor", vocab_size: int) -> list[int]:
    """The token ids set in one bitmask row."""
    return _unpack(bitmask_row, vocab_size)[0].nonzero()[0].tolist()


def apply_token_bitmask_inplace(logits: "torch.Tensor", bitmask: "torch.Tensor") -> None:
    """Set ``logits[i, t] = -inf`` where token ``t`` is not allowed by row ``i`` of the CPU
    ``bitmask`` (``logits``: ``[rows, V]`` or ``[V]``, any device; updated in place)."""
    import numpy as np
    import torch

    rows = logits.reshape(-1, logits.shape[-1])
    vocab = rows.shape[-1]
    if rows.device.type == "cpu" and rows.dtype == torch.float32 and rows.is_contiguous():
        np.copyto(rows.numpy(), -np.inf, where=~_unpack(bitmask, vocab))
        return
    shifts = torch.arange(32, dtype=torch.int32, device=rows.device)
    words = bitmask.reshape(rows.shape[0], -1).to(rows.device, non_blocking=True)
    allowed = ((words[:, :, None] >> shifts) & 1).bool().reshape(rows.shape[0], -1)[:, :vocab]
    rows.masked_fill_(~allowed, float("-inf"))

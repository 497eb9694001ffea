"""Tool-call formats whose arguments are JSON (or Python literals), built on the toolkit.

Each class is configured by class attributes; plugins subclass with their markers. All of them
follow :mod:`engine.parsers.toolkit`: unknown names and malformed blocks become content, canonical
arguments are ``json.dumps(..., ensure_ascii=False)``.

- :class:`JsonTagParser`: one JSON call object ``{"name", "arguments"|"parameters"}`` inside start
  and end tags (Qwen ``<tool_call>``, Hermes, InternLM actions, GigaChat 3 without end tag).
  String-aware: a closing tag inside a string argument does not end the call.
- :class:`JsonListParser`: a JSON array of calls after a start tag, optionally closed by an end
  tag (Mistral legacy arrays, Cohere ``<|START_ACTION|>``, Apertus single-key objects).
- :class:`JsonSequenceParser`: call objects separated by ``;`` after a prefix, or a response that
  opens with ``{`` (Llama 3 ``<|python_tag|>``).
- :class:`MistralParser`: ``[TOOL_CALLS]`` followed by either an array or ``name[ARGS]{...}``.
- :class:`SectionParser`: a section of units ``<begin>HEADER<sep>JSON<end>`` (DeepSeek V3/V3.1,
  Kimi K2); the header names the tool.
- :class:`PythonicParser`: ``[f(a=1, b="x"), g()]`` read with :mod:`ast`, literals only.

Streaming: ``incremental = True`` emits the name once read and then the arguments as they settle;
otherwise each call is emitted whole when its element (or block) is complete. Incremental formats
carry the toolkit's documented asymmetry: a call whose name was emitted and which then turns out
malformed (or is cut off by the end of the stream) has no counterpart in ``parse``; both return
its raw text as content. :class:`SectionParser` and :class:`JsonSequenceParser` are incremental;
:class:`JsonTagParser` and :class:`JsonListParser` when ``incremental`` is set; Mistral's array
form is, its compact form is not.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Callable

from engine.parsers.toolkit import (
    Block,
    CallState,
    JsonCallStreamer,
    JsonStreamer,
    StreamingToolParser,
    loads_json,
    match_token,
    next_token,
    skip_ws,
)

__all__ = [
    "JsonListParser",
    "JsonNamedObjectStreamer",
    "JsonSequenceParser",
    "JsonTagParser",
    "MistralParser",
    "PythonicParser",
    "SectionParser",
    "parse_pythonic_calls",
    "recover_pythonic_calls",
]

class JsonNamedObjectStreamer(JsonStreamer):
    """A single-key object ``{NAME: ARGS}`` (Apertus). ``name``/``arguments`` are final once
    ``done``; ``invalid`` when there is not exactly one key or ARGS is not an object."""

    def __init__(self, *, compact: bool = False) -> None:
        super().__init__(compact=compact, require_object=True)
        self.name: str | None = None
        self.arguments = ""
        self.invalid = False
        self._keys = 0
        self._at = 0
        self._key = ""

    def _on_key(self, key: str) -> None:
        self._keys += 1
        if self._keys == 1:
            self._key = key
        else:
            self.invalid = True

    def _on_value_start(self) -> None:
        self._at = len(self.out)

    def _on_value_end(self) -> None:
        raw = self.out[self._at :]
        if self._keys == 1 and raw.startswith("{"):
            self.name, self.arguments = self._key, raw
        else:
            self.invalid = True


# --------------------------------------------------------------------------- JSON in tags


def _feed_call(text: str, block: Block, call: CallState, *, publish: bool) -> bool:
    """Feed ``text`` from ``block.scan`` to the call's :class:`JsonCallStreamer`, copying its
    name and settled arguments to ``call`` when ``publish``. True once the object is complete;
    a failed or invalid one marks the block invalid."""
    js: JsonCallStreamer = call.data
    block.scan = js.feed(text, block.scan)
    if publish:
        if call.name is None and js.name is not None:
            call.name = js.name
        call.arguments = js.arguments
    if js.failed or js.invalid:
        block.invalid = True
        return False
    return js.done


def _expect(text: str, block: Block, token: str, final: bool) -> int | None:
    """The index after ``token`` where it follows ``block.scan`` (after whitespace). None tells
    ``advance`` to return: more text may bring it, or it is missing and the block is malformed."""
    j = match_token(text, skip_ws(text, block.scan), token, final)
    if j is not None and j < 0:
        block.invalid = True
        return None
    return j


class JsonTagParser(StreamingToolParser):
    """``<start> {"name": ..., "arguments": {...}} <end>``; one call per block.

    ``end_marker = ""``: the block ends with the JSON object. A complete object whose end tag is
    missing when the stream ends is accepted. Text between the object and the end tag, other
    than whitespace, makes the block malformed.

    With an end marker, the payload may also be a JSON array of call objects (as SGLang reads
    it): each object with a name is a call, other entries are skipped; the block's calls are
    emitted when its end tag arrives. An array without any call is malformed.
    """

    end_marker: str = ""
    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    incremental: bool = False
    parallel_calls: bool = True  #: whether a response may hold more than one call

    def call_constraint(self, forced: str, parallel: bool) -> Any:
        """Calls as ``<start>\n{"<name key>": NAME, "<args key>": ARGS}\n<end>``: the first
        start marker, name and arguments keys of the format, ARGS valid against the tool's
        parameters; one call unless both ``parallel`` and the format allow more."""
        from engine.api.grammar import GrammarSpec

        structures = [{"begin": self.start_markers[0] + "\n",
                       "schema": self.call_object_schema(name, self.name_keys[0],
                                                         self.args_keys[0]),
                       "end": "\n" + self.end_marker if self.end_marker else ""}
                      for name in self.callable_names(forced)]
        return GrammarSpec("tool_calls", json.dumps({
            "structures": structures, "parallel": parallel and self.parallel_calls}))

    def advance(self, text: str, block: Block, final: bool) -> None:
        if not block.calls and self.end_marker:
            i = getattr(block, "array_at", None)
            if i is None:
                i = skip_ws(text, block.scan)
                if i >= len(text) and not final:
                    return  # the payload's first character decides object or array
                if text.startswith("[", i):
                    block.array_at = i
            if i == getattr(block, "array_at", None):
                self._array(text, block, i, final)
                return
        if not block.calls:
            call = CallState(start=block.start)
            call.data = JsonCallStreamer(
                name_keys=self.name_keys, args_keys=self.args_keys, compact=self.compact
            )
            block.calls.append(call)
        call = block.calls[0]
        js: JsonCallStreamer = call.data
        if not js.done:
            # publish before judging, so every chunking decides alike
            if not _feed_call(text, block, call, publish=self.incremental):
                return
            if js.name is None or not self.accept(js.name):
                block.invalid = True
                return
            if self.incremental:
                call.arguments, call.done, call.end = js.arguments, True, block.scan
        end = self.end_marker
        i = skip_ws(text, block.scan)
        if not end:
            block.end = block.scan
        elif (j := match_token(text, i, end, final)) is None:
            return
        elif j >= 0:
            block.end = j
        elif final and i == len(text):
            block.end = block.scan
        else:
            block.invalid = True
            return
        call.name, call.arguments, call.done, call.end = js.name, js.arguments, True, block.end

    def accept(self, name: str) -> bool:
        """Extra validation of a complete call's name (e.g. one call per response)."""
        return True

    def _array(self, text: str, block: Block, i: int, final: bool) -> None:
        """A payload that is a JSON array of calls, read whole once the end tag arrives."""
        k = text.find(self.end_marker, i)
        if k < 0:
            block.scan = max(i, len(text) - len(self.end_marker) + 1)
            if final:
                block.invalid = True
            return
        block.end = k + len(self.end_marker)
        try:
            items = loads_json(text[i:k])
        except (ValueError, RecursionError):
            items = None
        for item in items if isinstance(items, list) else ():
            name = next((item.get(key) for key in self.name_keys
                         if isinstance(item, dict) and key in item), None)
            args = next((item.get(key) for key in self.args_keys
                         if isinstance(item, dict) and key in item), {})
            if isinstance(name, str) and isinstance(args, dict) and self.accept(name):
                block.calls.append(CallState(name, self.dump(args), True))
        if not block.calls:
            block.invalid = True


# --------------------------------------------------------------------------- JSON lists


class JsonListParser(StreamingToolParser):
    """``<start> [call, call, ...] <end>``: a JSON array of call objects.

    ``element``: ``"call"`` (objects with ``name_keys``/``args_keys``) or ``"named"`` (single-key
    ``{NAME: ARGS}``). ``end_marker`` (optional) must follow the array; a complete array whose end
    tag is missing at the end of the stream is accepted. Unknown names in the array become
    content (their element's raw text). A truncated array keeps its complete calls.
    ``bare_object``: the body may also be one call object without the array.
    """

    end_marker: str = ""
    bare_object: bool = False
    element: str = "call"
    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    incremental: bool = False

    def _new_streamer(self) -> JsonStreamer:
        if self.element == "named":
            return JsonNamedObjectStreamer(compact=self.compact)
        return JsonCallStreamer(
            name_keys=self.name_keys, args_keys=self.args_keys, compact=self.compact
        )

    def advance(self, text: str, block: Block, final: bool) -> None:
        phase = getattr(block, "phase", "open")
        while True:
            i = skip_ws(text, block.scan)
            if phase != "in" and i >= len(text):
                if final and phase == "trailer":
                    block.end = block.scan
                elif final and phase == "sep":
                    pass  # truncated array: complete calls stay, the rest is content
                block.phase = phase
                return
            if phase == "open":
                if self.bare_object and text[i] == "{":
                    block.single = True  # type: ignore[attr-defined]
                    phase = "elem"
                    continue
                if text[i] != "[":
                    block.invalid = True
                    return
                block.scan, phase = i + 1, "first"
            elif phase in ("first", "elem"):
                c = text[i]
                if phase == "first" and c == "]":
                    block.scan, phase = i + 1, "trailer"
                    continue
                if c != "{":
                    block.invalid = True
                    return
                call = CallState(start=i)
                call.data = self._new_streamer()
                block.calls.append(call)
                block.scan, phase = i, "in"
            elif phase == "in":
                call = block.calls[-1]
                js = call.data
                block.scan = js.feed(text, block.scan)
                if self.incremental:
                    if call.name is None and js.name is not None:
                        call.name = js.name
                    call.arguments = js.arguments
                if js.failed or js.invalid:
                    block.invalid = True
                    return
                if not js.done:
                    block.phase = phase
                    return
                if js.name is None:
                    block.invalid = True
                    return
                call.name, call.arguments, call.done, call.end = (
                    js.name, js.arguments, True, block.scan)
                phase = "trailer" if getattr(block, "single", False) else "sep"
            elif phase == "sep":
                c = text[i]
                if c == ",":
                    block.scan, phase = i + 1, "elem"
                elif c == "]":
                    block.scan, phase = i + 1, "trailer"
                else:
                    block.invalid = True
                    return
            else:  # trailer
                if not self.end_marker:
                    block.end = block.scan
                    return
                j = match_token(text, i, self.end_marker, final)
                if j is None:
                    block.phase = phase
                    return
                if j < 0:
                    block.invalid = True
                    return
                block.end = j
                return


class MistralParser(JsonListParser):
    """Mistral: ``[TOOL_CALLS] [{"name", "arguments"}, ...]`` (array, streamed incrementally) or
    ``[TOOL_CALLS]name[ARGS]{...}`` (compact, one call per unit, emitted when its JSON closes).
    A missing ``]`` after ``[TOOL_CALLS`` or ``[ARGS`` is tolerated. Every compact unit is
    parsed (not only the first)."""

    start_markers = ("[TOOL_CALLS",)
    incremental = True
    join_with_whitespace = True  # content = text before + " " + text after, as the reference
    _NAME = re.compile(r"[A-Za-z0-9_.\-]*")

    def call_constraint(self, forced: str, parallel: bool) -> Any:
        """Calls in the array form, ``[TOOL_CALLS] [{"name": NAME, "arguments": ARGS}, ...]``
        (one element unless ``parallel``), ARGS valid against the tool's parameters."""
        from engine.api.grammar import GrammarSpec

        structures = [{"begin": "", "end": "",
                       "schema": self.call_object_schema(name, "name", "arguments")}
                      for name in self.callable_names(forced)]
        return GrammarSpec("tool_calls", json.dumps({
            "structures": structures, "parallel": parallel, "prefix": "[TOOL_CALLS] [",
            "separator": ", ", "suffix": "]"}))

    def advance(self, text: str, block: Block, final: bool) -> None:
        mode = getattr(block, "mode", None)
        if mode is None:
            i = block.scan
            if i >= len(text):
                if final:
                    block.invalid = True
                return
            if text[i] == "]":
                i += 1
            i = skip_ws(text, i)
            if i >= len(text):
                if final:
                    block.invalid = True
                return
            block.scan = i
            block.mode = mode = "array" if text[i] == "[" else "compact"
        if mode == "array":
            super().advance(text, block, final)
            return
        self._compact(text, block, final)

    def _compact(self, text: str, block: Block, final: bool) -> None:
        js = getattr(block, "json", None)
        if js is None:
            m = self._NAME.match(text, block.scan)
            j = m.end()
            if j >= len(text):
                if final or j - block.scan > 256:
                    block.invalid = True
                return
            k = match_token(text, j, "[ARGS", final)
            name = text[block.scan : j]
            if k is None:
                return
            if k < 0 or not name:
                block.invalid = True
                return
            if k < len(text) and text[k] == "]":
                k += 1
            elif k >= len(text) and not final:
                return  # the optional "]" may still come
            block.name, block.json = name, JsonStreamer(compact=self.compact)
            block.scan = k
            js = block.json
        block.scan = js.feed(text, block.scan)
        if js.failed:
            block.invalid = True
        elif js.done:
            block.end = block.scan
            block.calls.append(CallState(block.name, js.out, True, block.start, block.end))


def _balanced_end(text: str, i: int) -> int | None:
    """Just past the bracket closing the one at ``i``, skipping Python/JSON strings; None while
    the text may still complete it, -1 when it cannot (a stray closer)."""
    depth, quote, n = 0, "", len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
            if depth < 0:
                return -1
            if depth == 0:
                return i + 1
        i += 1
    return None


class JsonSequenceParser(StreamingToolParser):
    """Llama 3: ``<|python_tag|>{call}; {call}`` or a response that opens with ``{``.

    Calls are ``{"name", "parameters"|"arguments"}`` objects separated by ``;``; the block ends
    after the last object (text after it is content). Streamed incrementally. An object written
    as a Python dict (``{'name': 'f', 'arguments': {'a': 1}}``) is read too, as SGLang converts
    it; such a call is emitted when its closing brace arrives.
    """

    start_markers = ("<|python_tag|>",)
    separator = ";"
    incremental = True
    bare_object_at_start = True

    def __init__(self, *, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools=tools)
        self._opened = False  # some non-whitespace text or a block has been seen

    def call_constraint(self, forced: str, parallel: bool) -> Any:
        """Calls as bare objects at the start of the response, ``{"name": NAME, "parameters":
        ARGS}`` (with ``parallel``, one or more separated by ``;``), ARGS valid against the
        tool's parameters. Without ``bare_object_at_start`` they follow the start marker."""
        from engine.api.grammar import GrammarSpec

        structures = [{"begin": "", "end": "",
                       "schema": self.call_object_schema(name, "name", "parameters")}
                      for name in self.callable_names(forced)]
        prefix = "" if self.bare_object_at_start else self.start_markers[0]
        return GrammarSpec("tool_calls", json.dumps({
            "structures": structures, "parallel": parallel, "prefix": prefix,
            "separator": self.separator}))

    def find_start(self, text: str, pos: int) -> tuple[int, str] | None:
        if self.bare_object_at_start and not self._opened:
            i = skip_ws(text, pos)
            if i < len(text):
                self._opened = True
                if text[i] == "{":
                    return (i, "{")
        return super().find_start(text, pos)

    def advance(self, text: str, block: Block, final: bool) -> None:
        if block.marker == "{" and not block.calls and block.scan == block.start + 1:
            block.scan = block.start
        while True:
            if not block.calls or block.calls[-1].done:
                i = skip_ws(text, block.scan)
                if block.calls:  # after a call: a separator, or the end of the block
                    if i >= len(text):
                        if final:
                            block.end = block.calls[-1].end
                        return
                    if text[i] != self.separator:
                        block.end = block.calls[-1].end
                        return
                    i = skip_ws(text, i + 1)
                if i >= len(text):
                    if final:
                        if block.calls:
                            block.end = block.calls[-1].end
                        else:
                            block.invalid = True
                    return
                if text[i] != "{":
                    if block.calls:
                        block.end = block.calls[-1].end
                    else:
                        block.invalid = True
                    return
                call = CallState(start=i)
                call.data = JsonCallStreamer(compact=self.compact)
                block.calls.append(call)
                block.scan = i
            call = block.calls[-1]
            if call.data is None:  # a Python dict, read whole
                if not self._python_dict(text, block, call, final):
                    return
                continue
            if not _feed_call(text, block, call, publish=True):
                if block.invalid and call.name is None and text.startswith(
                        "'", skip_ws(text, call.start + 1)):
                    block.invalid, call.data = False, None
                    continue
                return
            if call.name is None:
                block.invalid = True
                return
            call.done, call.end = True, block.scan

    def _python_dict(self, text: str, block: Block, call: CallState, final: bool) -> bool:
        """Read the call at ``call.start`` as a Python dict literal; True once it is complete."""
        end = _balanced_end(text, call.start)
        if end is None or end < 0:
            block.invalid = end is not None or final
            return False
        try:
            obj = _literal(ast.parse(text[call.start:end], mode="eval").body, text[call.start:end])
        except (SyntaxError, ValueError, RecursionError, MemoryError, _NotLiteral):
            obj = None
        name = obj.get("name") if isinstance(obj, dict) else None
        args = next((obj[k] for k in ("parameters", "arguments") if k in obj), {}) \
            if isinstance(obj, dict) else None
        if not isinstance(name, str) or not isinstance(args, dict):
            block.invalid = True
            return False
        call.name, call.arguments, call.done, call.end = name, self.dump(args), True, end
        block.scan = end
        return True


# --------------------------------------------------------------------------- header sections


class SectionParser(StreamingToolParser):
    """A section ``<begin> (<call_begin> HEADER <header_end> JSON [trailer] <call_end>)* <end>``.

    Subclasses set the markers and :meth:`call_name` (the tool name from the header text, or
    None when malformed). The name is emitted when ``header_end`` arrives and the arguments
    stream as the JSON settles. Whitespace between elements is allowed. A section whose end
    marker is missing when the stream ends keeps its complete calls.
    """

    section_end: tuple[str, ...] = ()
    call_begin = ""
    header_end = ""
    args_trailer = ""  #: text after the JSON, before ``call_end`` (DeepSeek V3's closing fence)
    call_end = ""
    max_header = 512

    def call_name(self, header: str) -> str | None:
        name = header.strip()
        return name or None

    def advance(self, text: str, block: Block, final: bool) -> None:
        while True:
            phase = getattr(block, "phase", "between")
            if phase == "between":
                found = next_token(text, block, (self.call_begin, *self.section_end), final)
                if found is None:
                    return
                i, tok, j = found
                if tok != self.call_begin:
                    block.end = j
                    return
                block.calls.append(CallState(start=i))
                block.scan, block.phase = j, "header"
            elif phase == "header":
                k = text.find(self.header_end, block.scan)
                if k < 0:
                    if len(text) - block.scan > self.max_header or final:
                        block.invalid = True
                    return
                name = self.call_name(text[block.scan : k])
                if name is None:
                    block.invalid = True
                    return
                call = block.calls[-1]
                call.name, call.data = name, JsonStreamer(compact=self.compact)
                block.scan, block.phase = k + len(self.header_end), "args"
            elif phase == "args":
                call = block.calls[-1]
                js = call.data
                block.scan = js.feed(text, block.scan)
                call.arguments = js.out
                if js.failed:
                    block.invalid = True
                    return
                if not js.done:
                    return
                call.done, call.end = True, block.scan
                block.phase = "trailer" if self.args_trailer else "close"
            elif phase == "trailer":
                j = _expect(text, block, self.args_trailer, final)
                if j is None:
                    return
                block.scan, block.phase = j, "close"
            else:  # close
                j = _expect(text, block, self.call_end, final)
                if j is None:
                    return
                block.calls[-1].end = j
                block.scan, block.phase = j, "between"


# --------------------------------------------------------------------------- pythonic


class _NotLiteral(Exception):
    pass


_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False,
               "None": None}


def _number_text(node: ast.AST, src: str, value: float) -> str:
    """A number beyond float range (``1e999``) is kept as the string of its text: JSON has no
    infinities, and arguments must stay valid JSON."""
    return (ast.get_source_segment(src, node) if src else None) or json.dumps(value)


def _literal(node: ast.AST, src: str = "") -> Any:
    """A Python (or JSON-style) literal; anything else raises ``_NotLiteral``. ``src``: the
    parsed text (for the text of non-finite numbers)."""
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, float) and not math.isfinite(v):
            return _number_text(node, src, v)
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        raise _NotLiteral
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, src) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _NotLiteral
            key = _literal(k, src)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise _NotLiteral
            out[key] = _literal(v, src)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = node.operand
        if isinstance(inner, ast.Constant) and isinstance(inner.value, float) and not (
                math.isfinite(inner.value)):
            sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
            return _number_text(node, src, sign * inner.value)
        v = _literal(inner, src)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
        raise _NotLiteral
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise _NotLiteral


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _call_name(node.value)
        return None if base is None else base + "." + node.attr
    return None


def parse_pythonic_calls(
    src: str, params: Callable[[str], list[str]] | None = None
) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(a=1), g(b="x")]`` → ``[("f", {"a": 1}), ("g", {"b": "x"})]``; None if it is not a
    list of calls with literal arguments. Nothing is evaluated.

    Positional arguments (``f("x")``) do not make the list unreadable: SGLang ignores them;
    here, when ``params(name)`` gives the tool's declared parameter names, they take those
    names in order (after the ones given as keywords), so the value is not lost; beyond the
    declared ones, or without ``params``, they are ignored."""
    src = src.strip()
    try:
        tree = ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    body = tree.body
    if not isinstance(body, ast.List) or not body.elts:
        return None
    calls = []
    try:
        for el in body.elts:
            if not isinstance(el, ast.Call):
                return None
            name = _call_name(el.func)
            if name is None or any(kw.arg is None for kw in el.keywords):
                return None
            args = {kw.arg: _literal(kw.value, src) for kw in el.keywords}
            if any(isinstance(a, ast.Starred) for a in el.args):
                return None
            free = [k for k in (params(name) if params and el.args else ()) if k not in args]
            for key, node in zip(free, el.args):
                args[key] = _literal(node, src)
            for node in el.args[len(free):]:
                _literal(node, src)  # ignored, but still a literal
            calls.append((name, args))
    except (_NotLiteral, RecursionError):
        return None
    return calls


_RECOVER_HEAD = re.compile(r"(?:^\s*|\)\s*,\s*)([A-Za-z_][\w.]*)\s*\(")
_RECOVER_ARG = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=(?!=)")


def _recover_value(raw: str) -> Any:
    v = raw.strip()
    try:
        node = ast.parse(v, mode="eval").body
        return _literal(node, v)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _NotLiteral):
        pass
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]  # a string holding its own unescaped quotes
    return v


def recover_pythonic_calls(src: str) -> list[tuple[str, dict[str, Any]]] | None:
    """A lenient reading of a pythonic call list that :func:`parse_pythonic_calls` refuses,
    for string values holding their own unescaped quotes (``[f(q='sed -n '1,2p' x')]`` gives
    ``q = "sed -n '1,2p' x"``): calls are split at ``), name(`` and arguments at ``, key=``;
    a value that is not a literal but is quoted is the text between its outer quotes. None
    when even that shape is missing."""
    src = src.strip()
    if not (src.startswith("[") and src.endswith("]")):
        return None
    inner = src[1:-1].strip()
    if not inner.endswith(")"):
        return None
    heads = list(_RECOVER_HEAD.finditer(inner))
    if not heads or heads[0].start() != 0:
        return None
    calls = []
    for k, head in enumerate(heads):
        stop = heads[k + 1].start() if k + 1 < len(heads) else len(inner) - 1
        body = inner[head.end() : stop]
        args: dict[str, Any] = {}
        keys = list(_RECOVER_ARG.finditer(body))
        if (keys[0].start() if keys else len(body)) != 0 and body.strip():
            return None
        for j, key in enumerate(keys):
            end = keys[j + 1].start() if j + 1 < len(keys) else len(body)
            args[key.group(1)] = _recover_value(body[key.end() : end])
        calls.append((head.group(1), args))
    return calls


_PY_SCAN = re.compile(r"""[\[\](){}'"#]""")
_QUOTE_STOP = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}


class PythonicParser(StreamingToolParser):
    """A Python list of calls ``[get_weather(city="Paris", days=3), get_time(tz="CET")]``.

    Starts at ``[`` followed by ``name(`` (or at a ``start_markers`` wrapper such as Llama 4's
    ``<|python_start|>``, whose ``wrapper_end`` is dropped after the list). Calls are emitted when
    the list closes (atomic). Only keyword arguments with literal values are accepted;
    ``true``/``false``/``null`` are read as JSON literals. The text around the list is kept
    verbatim (``trim_whitespace`` off), as SGLang's pythonic parser keeps it.
    """

    start_markers = ("[", "<|python_start|>")
    trim_whitespace = False
    wrapper_markers: tuple[str, ...] = ("<|python_start|>",)
    wrapper_end = "<|python_end|>"
    _HEAD = re.compile(r"\s*[A-Za-z_][\w.]*\s*\(")
    _HEAD_PARTIAL = re.compile(r"\s*(?:[A-Za-z_][\w.]*\s*)?\Z")

    def call_constraint(self, forced: str, parallel: bool) -> Any:
        """Calls as a Python list, ``[NAME(key=VALUE, ...), ...]`` (one call unless
        ``parallel``): keyword arguments for the tool's declared parameters in their order, the
        required ones always, values written as JSON literals (which the list reader takes as
        Python literals; ``true``/``false``/``null`` included). None - checked after generation
        - when a tool name or parameter name cannot be written so."""
        from engine.api.grammar import GrammarSpec

        structures = []
        for name in self.callable_names(forced):
            schema = self.tool_schema(name) or {"type": "object"}
            props = schema.get("properties") or {}
            if not re.fullmatch(r"[A-Za-z_][\w.]*", name) or \
                    not all(isinstance(k, str) and k.isidentifier() for k in props) or \
                    not set(schema.get("required") or ()) <= set(props):
                return None
            structures.append({"begin": name + "(", "end": ")", "arguments": "kwargs",
                               "schema": schema})
        return GrammarSpec("tool_calls", json.dumps({
            "structures": structures, "parallel": parallel, "prefix": "[", "separator": ", ",
            "suffix": "]"}))

    def advance(self, text: str, block: Block, final: bool) -> None:
        if not hasattr(block, "depth"):
            at = block.start
            if block.marker in self.wrapper_markers:
                at = skip_ws(text, block.scan)
                if at >= len(text):
                    if final:
                        block.invalid = True
                    return
                if text[at] != "[":
                    block.invalid = True
                    return
            m = self._HEAD.match(text, at + 1)
            if m is None:
                if final or not self._HEAD_PARTIAL.match(text, at + 1):
                    block.invalid = True
                return
            block.list_at, block.depth, block.quote, block.scan = at, 0, "", at
        self._scan(text, block)
        if block.invalid or block.depth or not hasattr(block, "list_end"):
            if final and not block.invalid:
                block.invalid = True
            return
        j = block.list_end
        if block.marker in self.wrapper_markers:
            i = skip_ws(text, j)
            k = match_token(text, i, self.wrapper_end, final)
            if k is None:
                return
            j = k if k >= 0 else j
        calls = self.read_list(text[block.list_at : block.list_end])
        block.end = j
        if calls is None:
            block.invalid = True
            return
        for name, args in calls:
            block.calls.append(CallState(name, self.dump(args), True))

    def read_list(self, src: str) -> list[tuple[str, dict[str, Any]]] | None:
        return parse_pythonic_calls(src, self.param_names)

    def param_names(self, name: str) -> list[str]:
        """The declared parameter names of tool ``name``, in order (positional arguments)."""
        props = self.tool_schema(name).get("properties")
        return list(props) if isinstance(props, dict) else []

    def _scan(self, text: str, block: Block) -> None:
        """Bracket matching aware of Python strings, resumable at ``block.scan``."""
        i, n = block.scan, len(text)
        depth, quote = block.depth, block.quote
        while i < n:
            if quote:
                m = _QUOTE_STOP[quote].search(text, i)
                if m is None:
                    i = n
                    break
                j = m.start()
                if text[j] == "\\":
                    if j + 1 >= n:
                        i = j
                        break
                    i = j + 2
                    continue
                quote, i = "", j + 1
                continue
            m = _PY_SCAN.search(text, i)
            if m is None:
                i = n
                break
            c, i = m.group(), m.end()
            if c in "'\"":
                quote = c
            elif c in "[({":
                depth += 1
            elif c == "#":
                block.invalid = True
                return
            else:
                depth -= 1
                if depth < 0:
                    block.invalid = True
                    return
                if depth == 0:
                    block.list_end = i
                    break
        block.scan, block.depth, block.quote = i, depth, quote

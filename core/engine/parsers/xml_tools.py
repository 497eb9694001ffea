"""XML-parameter tool-call formats: configurable grammars, values typed by the tool schema.

Three body grammars cover the XML-parameter families of the fact sheet:

* :class:`InvokeFormat`: ``<NSinvoke name="f"><NSparameter name="k">v</NSparameter></NSinvoke>``
  inside an optional block wrapper (DSML/GCML, MiniMax-M2, dots, Muse ATEM, Step3 steptml,
  MiniCPM ``<function name=..><param name=..>``).
* :class:`FunctionFormat`: ``<tool_call><function=f><parameter=k>v</parameter></function>``
  (Qwen3-Coder, Step-3.5, MiMo, Nanbeige).
* :class:`ArgPairFormat`: ``<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>``
  (GLM-4.5/4.7, Ling-3, Poolside, Spark 2.5, IQuest, Hunyuan, K2 Horizon).

A format (:class:`XmlFormat`) names the markers that open a *region* and resolves a region into
:class:`ParsedCall` objects, or declares it malformed (then its text is content: bad structure,
or unterminated at the end of the stream). Parameter text becomes JSON values through
:class:`ValueTyping` (the ``*_TYPING`` presets are the fact sheet's rules per family).

:class:`XmlToolParser` runs a format on the toolkit's :class:`StreamingToolParser` (marker
hold-back, settled offset, name validation against ``tools``, whitespace trimming). Calls are
emitted atomically when their region closes, so streaming equals parsing for every split.
Formats that differ in framing (Muse, MiniMax-M3) subclass :class:`XmlFormat` in their plugin.
"""

from __future__ import annotations

import ast
import html
import json
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from engine.parsers.toolkit import Block, CallState, StreamingToolParser

# --------------------------------------------------------------------------- value typing

_STRING_WORDS = ("string", "str", "text", "varchar", "char", "enum")
_OBJECT_WORDS = ("object", "dict", "map", "obj")
_ARRAY_WORDS = ("array", "list", "arr", "tuple", "sequence")
_INT_RE = re.compile(r"[-+]?\d+")
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def normalize_type(word: str) -> str | None:
    """Map a schema type word or a common alias (``str``, ``int64``, ``float``, ``dict`` ...)
    to a JSON-schema type name, or ``None`` when it is not a known type."""
    w = word.strip().lower()
    if w in _STRING_WORDS:
        return "string"
    if w.startswith(("int", "uint", "unsigned")) or w in ("long", "short"):
        return "integer"
    if w.startswith("num") or w.startswith("float") or w in ("double", "decimal"):
        return "number"
    if w.startswith("bool"):
        return "boolean"
    if w in _OBJECT_WORDS:
        return "object"
    if w in _ARRAY_WORDS:
        return "array"
    if w in ("null", "none", "nil"):
        return "null"
    return None


def resolve_ref(schema: Any, root: dict[str, Any] | None) -> Any:
    """Follow local ``$ref`` pointers (``#/$defs/X``, ``#/definitions/X``) inside ``root``."""
    for _ in range(16):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root or {}
        for part in ref[2:].split("/"):
            key = part.replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            return schema
        schema = target
    return schema


def schema_types(prop: Any, root: dict[str, Any] | None = None) -> list[str]:
    """Every JSON type a property schema admits (``type`` or a list of them, anyOf/oneOf/allOf,
    ``enum``/``const`` values, local ``$ref``), normalized, in first-seen order."""
    out: list[str] = []

    def add(name: str | None) -> None:
        if name and name not in out:
            out.append(name)

    def walk(s: Any, depth: int) -> None:
        s = resolve_ref(s, root)
        if not isinstance(s, dict) or depth > 8:
            return
        declared = s.get("type")
        for word in declared if isinstance(declared, list) else [declared]:
            add(normalize_type(word) if isinstance(word, str) else None)
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in s.get(key) or ():
                walk(sub, depth + 1)
        if declared is None:
            for v in list(s.get("enum") or ()) + ([s["const"]] if "const" in s else []):
                add(json_type(v))

    walk(prop, 0)
    return out


def json_type(v: Any) -> str:
    """The JSON-schema type name of a Python value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "string"


def property_schema(params: dict[str, Any], key: str) -> Any:
    """The schema of property ``key`` of a tool's parameters schema (``None`` if undeclared).
    Properties declared under a top-level ``anyOf``/``oneOf``/``allOf`` count too (several
    declarations of one key are combined as an ``anyOf``)."""

    def walk(s: Any, depth: int) -> list[Any]:
        s = resolve_ref(s, params)
        if not isinstance(s, dict) or depth > 8:
            return []
        props = s.get("properties")
        if isinstance(props, dict) and key in props:
            return [props[key]]
        found: list[Any] = []
        for word in ("anyOf", "oneOf", "allOf"):
            subs = s.get(word)
            for sub in subs if isinstance(subs, list) else ():
                found.extend(walk(sub, depth + 1))
        return found

    found = walk(params, 0) if isinstance(params, dict) else []
    if not found:
        return None
    return found[0] if len(found) == 1 else {"anyOf": found}


_MISSING = object()


def _reject_constant(word: str) -> Any:
    raise ValueError(f"non-finite number {word}")


def _finite_float(word: str) -> float:
    value = float(word)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {word}")
    return value


def loads_finite(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and numbers beyond float range such as
    ``1e999`` (arguments must stay valid JSON: such a value stays its raw text)."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _json(text: str) -> Any:
    try:
        return loads_finite(text)
    except (ValueError, RecursionError):
        return _MISSING


def _literal(text: str) -> Any:
    try:
        value = ast.literal_eval(text.strip())
    except Exception:  # literal_eval raises many kinds on arbitrary model text
        return _MISSING
    try:  # tuples become lists; sets, bytes, complex and non-finite numbers are refused
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return _MISSING


def _unescaped_json(text: str) -> Any:
    """Over-escaped JSON (a JSON text written as the body of a JSON string, its quotes and
    backslashes escaped once more): undo one level of string escaping, every escape (so a
    doubled backslash becomes one), else only the escaped quotes."""
    if '\\"' not in text:
        return _MISSING
    try:
        value = _json(json.loads('"' + text + '"', strict=False))
    except (ValueError, RecursionError):
        value = _MISSING
    return value if value is not _MISSING else _json(text.replace('\\"', '"'))


def _first(text: str, *decoders: Callable[[str], Any]) -> Any:
    for decode in decoders:
        value = decode(text)
        if value is not _MISSING:
            return value
    return text


#: decoder chains by name, each ending in the raw text
CHAINS: dict[str, tuple[Callable[[str], Any], ...]] = {
    "raw": (),
    "json": (_json,),
    "eval": (_json, _literal),
    "loose": (_json, _unescaped_json, _literal),
}


@dataclass(frozen=True)
class ValueTyping:
    """How a parameter's raw text becomes a JSON value, given the property's schema.

    Preparation: ``cdata`` unwraps ``<![CDATA[...]]>``; ``html`` unescapes entities; ``trim`` is
    ``"none"``, ``"newline"`` (at most one ``\\n`` off each side) or ``"strip"``.
    A property whose schema admits only ``string`` keeps the prepared text (``honour_string``).
    Other declared types: ``typed`` names a chain of :data:`CHAINS`, or ``"schema"``: try each
    declared type in ``priority`` order (integer, number, boolean words, JSON object/array,
    null), then JSON, then the raw text. Undeclared properties use the ``untyped`` chain.
    ``null_word``: the literal ``null`` is ``None`` whatever the type (``"any_case"``: also
    ``NULL``, ``Null``...). A quoted number
    (``"42"``) for a parameter declared numeric and not string is the number, as SGLang
    coerces it. ``null_words``: the texts a parameter admitting ``null`` reads as None;
    ``integral_numbers``: a whole float for a ``number`` parameter (``3.0``) is an integer.
    """

    trim: str = "none"
    html: bool = False
    cdata: bool = False
    typed: str = "loose"
    untyped: str = "loose"
    honour_string: bool = True
    null_word: bool | str = False
    priority: tuple[str, ...] = ("integer", "number", "boolean", "object", "array", "null")
    true_words: tuple[str, ...] = ("true",)
    false_words: tuple[str, ...] = ("false",)
    null_words: tuple[str, ...] = ("null", "None", "")
    integral_numbers: bool = False

    def prepare(self, raw: str) -> str:
        """The text of a value before decoding (CDATA, entities, trimming)."""
        text = raw
        if self.cdata:
            s = text.strip()
            if s.startswith("<![CDATA[") and s.endswith("]]>"):
                text = s[9:-3]
        if self.html:
            text = html.unescape(text)
        if self.trim == "strip":
            text = text.strip()
        elif self.trim == "newline":
            text = text[1:] if text.startswith("\n") else text
            text = text[:-1] if text.endswith("\n") else text
        return text

    def convert(self, raw: str, prop: Any, root: dict[str, Any] | None = None) -> Any:
        """Decode one value; never raises (the raw text is the last resort)."""
        text = self.prepare(raw)
        types = schema_types(prop, root) if prop is not None else []
        word = text.strip().lower() if self.null_word == "any_case" else text.strip()
        if self.null_word and word == "null":
            return None
        if self.honour_string and types and set(types) <= {"string", "null"}:
            return text
        if not types:
            return _first(text, *CHAINS[self.untyped])
        s = text.strip()
        if "string" not in types and len(s) > 2 and s[0] == s[-1] == '"':
            for kind in ("integer", "number"):  # a quoted number for a numeric parameter
                value = self._as(kind, s[1:-1]) if kind in types else _MISSING
                if value is not _MISSING:
                    return value
        if self.typed != "schema":
            if self.honour_string and "string" in types:
                return text
            return _first(text, *CHAINS[self.typed])
        for kind in self.priority:
            if kind in types:
                value = self._as(kind, text.strip())
                if value is not _MISSING:
                    return value
        if "string" in types:
            return text
        return _first(text, _json)

    def _as(self, kind: str, s: str) -> Any:
        if kind == "integer":
            return int(s) if _INT_RE.fullmatch(s) else _MISSING
        if kind == "number":
            if _INT_RE.fullmatch(s):
                return int(s)
            if not _FLOAT_RE.fullmatch(s) or not math.isfinite(float(s)):
                return _MISSING
            value = float(s)
            return int(value) if self.integral_numbers and value.is_integer() else value
        if kind == "boolean":
            low = s.lower()
            if low in self.true_words:
                return True
            return False if low in self.false_words else _MISSING
        if kind in ("object", "array"):
            want = dict if kind == "object" else list
            value = _first(s, _json, _literal)
            return value if isinstance(value, want) else _MISSING
        if kind == "null":
            return None if s in self.null_words else _MISSING
        return _MISSING


#: value typings shared by several format plugins (a plugin with its own rules defines its
#: own ``ValueTyping``)
SCHEMA_TYPING = ValueTyping(typed="schema", untyped="json", null_word=True)
DSML_TYPING = ValueTyping(trim="strip", typed="schema", untyped="json", null_word=True)
JSON_TYPING = ValueTyping(typed="json", untyped="json", honour_string=False)


def matches_schema(value: Any, prop: Any, root: dict[str, Any] | None = None) -> bool:
    """Whether ``value`` has one of the types ``prop`` declares (``True`` when none declared)."""
    types = schema_types(prop, root)
    if not types:
        return True
    have = json_type(value)
    return have in types or (have == "integer" and "number" in types)


def validate_arguments(args: dict[str, Any], params: dict[str, Any]) -> bool:
    """A small JSON-schema check of completed arguments: required keys present, declared types
    respected, no extra keys when ``additionalProperties`` is false."""
    params = resolve_ref(params, params) if isinstance(params, dict) else {}
    props = params.get("properties") or {}
    if any(k not in args for k in params.get("required") or ()):
        return False
    if params.get("additionalProperties") is False and any(k not in props for k in args):
        return False
    return all(matches_schema(v, props[k], params) for k, v in args.items() if k in props)


# --------------------------------------------------------------------------- regions and formats


class ToolContext(Protocol):
    """What a format needs from the parser: the request's tool names and schemas."""

    tool_names: set[Any]

    def tool_schema(self, name: str) -> dict[str, Any]: ...


@dataclass
class ParsedCall:
    """One complete call: ``args`` decoded; ``start``/``end`` its raw span in a multi-call
    region (absolute offsets), so an unknown call alone can be returned as content."""

    name: str
    args: dict[str, Any]
    start: int | None = None
    end: int | None = None


@dataclass
class Region:
    """How a region resolved. ``calls is None``: not well-formed, so it is content: the text up
    to ``end``, or only the opener when ``end`` is ``None``. ``dropped``: it vanishes."""

    end: int | None
    calls: list[ParsedCall] | None
    dropped: bool = False


_ATTR_RE = re.compile(r"""([\w:.-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")
_WS = " \t\r\n"


def parse_attrs(header: str) -> dict[str, str]:
    """``name="x" string='true' k=v`` -> dict (quoted or bare values)."""
    out = {}
    for m in _ATTR_RE.finditer(header):
        out[m[1]] = next(g for g in m.groups()[1:] if g is not None)
    return out


def skip_ws(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not whitespace."""
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def open_tag_at(text: str, pos: int, tags: tuple[str, ...]) -> str | None:
    """The tag of ``tags`` whose ``<tag`` opens at ``pos`` (followed by space or ``>``)."""
    for tag in tags:
        n = pos + 1 + len(tag)
        if text.startswith("<" + tag, pos) and n < len(text) and text[n] in _WS + ">":
            return tag
    return None


def earliest(text: str, needles: tuple[str, ...], pos: int) -> tuple[int, str]:
    """The first occurrence at or after ``pos`` of any needle (the longest on a tie):
    ``(index, needle)``, or ``(-1, "")``."""
    best, found = -1, ""
    for needle in needles:
        i = text.find(needle, pos)
        if i >= 0 and (best < 0 or i < best or (i == best and len(needle) > len(found))):
            best, found = i, needle
    return best, found


def json_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """``{"name": f, "arguments"|"parameters": {...}}`` or ``{"function": {...}}`` -> a call."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _json(args)
    return (obj["name"], args) if isinstance(args, dict) else None


def json_calls(body: str, lists: bool = False) -> list[ParsedCall] | None:
    """The calls of a JSON body: one call object, or (``lists``) a JSON array of them."""
    obj = _json(body.strip())
    items = obj if lists and isinstance(obj, list) else [obj]
    calls = [json_call(o) for o in items]
    if not calls or any(c is None for c in calls):
        return None
    return [ParsedCall(c[0], c[1]) for c in calls if c is not None]


def _body_calls(
    body: str,
    at: int,
    json_ok: bool,
    read: Callable[[str, int], tuple[tuple[str, dict[str, Any]], int] | None],
) -> list[ParsedCall] | None:
    """The calls of a region body (``at``: its absolute offset): one JSON call object when
    ``json_ok`` and it starts with ``{``, else a whitespace-separated run of calls, each read by
    ``read(body, pos)`` -> ``((name, args), end)``, or None when malformed."""
    if json_ok and body.strip().startswith("{"):
        return json_calls(body)
    calls: list[ParsedCall] = []
    pos = skip_ws(body, 0)
    while pos < len(body):
        found = read(body, pos)
        if found is None:
            return None
        (name, args), end = found
        calls.append(ParsedCall(name, args, at + pos, at + end))
        pos = skip_ws(body, end)
    return calls or None


class XmlFormat(ABC):
    """A wire format: the markers that open a region and how a region resolves.

    ``openers``/``drop_markers`` feed :class:`XmlToolParser`'s marker scan. ``unknown``:
    ``"content"`` (a call to a tool not in the request stays content) or ``"drop"`` (it
    vanishes). ``compact``: compact argument separators. ``typing`` decodes values.
    ``framing_tokens``: the markers are control tokens (a malformed region is content without
    them, see :class:`StreamingToolParser`).
    """

    typing: ValueTyping
    unknown: str = "content"
    compact: bool = False
    drop_markers: tuple[str, ...] = ()
    framing_tokens: bool = False

    @property
    @abstractmethod
    def openers(self) -> tuple[str, ...]:
        """Literal markers where a region may begin."""

    def closers(self, opener: str) -> tuple[str, ...]:
        """Literals that end a region opened by ``opener`` (the earliest wins)."""
        raise NotImplementedError

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        """The calls of a complete region whose body ``body`` starts at offset ``at``, or
        ``None`` when it is not well-formed."""
        raise NotImplementedError

    def region(
        self, ctx: ToolContext, text: str, start: int, opener: str, final: bool, scan: int
    ) -> Region | None:
        """Resolve the region opened at ``start``; ``None`` while more text is needed (never
        with ``final``). ``scan``: text before it was already searched for a closer."""
        closes = self.closers(opener)
        body_at = start + len(opener)
        longest = max(len(c) for c in closes)
        j, close = earliest(text, closes, max(body_at, scan - longest + 1))
        if j < 0:
            return Region(None, None) if final else None
        return Region(j + len(close), self.parse(ctx, opener, text[body_at:j], body_at))

    def value(
        self, ctx: ToolContext, name: str, key: str, raw: str, hint: str | None = None
    ) -> Any:
        """Decode parameter ``key`` of tool ``name``; ``hint``: a type written inline."""
        params = ctx.tool_schema(name)
        prop = property_schema(params, key)
        if hint and not schema_types(prop, params):
            prop = {"type": hint}
        return self.typing.convert(raw, prop, params)


class XmlToolParser(StreamingToolParser):
    """A :class:`StreamingToolParser` driven by an :class:`XmlFormat`.

    Calls are emitted atomically when their region closes (name and complete arguments in one
    delta), so streaming equals non-streaming for every split. Content before a region yielding
    calls, and whitespace after it, is trimmed (the toolkit's ``trim_whitespace``). ``samples``:
    texts of the plugin's format that the conformance kit checks (``conformance_samples``).
    """

    def __init__(self, *, tools: list[dict[str, Any]] | None = None, fmt: XmlFormat,
                 samples: tuple[str, ...] = ()) -> None:
        self.fmt = fmt
        #: texts of the format for the conformance kit (``engine plugins check``)
        self.conformance_samples = tuple(samples)
        self.start_markers = fmt.openers
        self.drop_markers = fmt.drop_markers
        self.framing_tokens = fmt.framing_tokens
        self.compact = fmt.compact
        super().__init__(tools=tools)

    def advance(self, text: str, block: Block, final: bool) -> None:
        r = self.fmt.region(self, text, block.start, block.marker, final, block.scan)
        if r is None:
            block.scan = len(text)
            return
        block.end = r.end
        calls = r.calls
        if calls is not None and self.fmt.unknown == "drop":
            calls = [c for c in calls if c.name in self.tool_names]
            r.dropped = r.dropped or not calls
        if r.dropped:
            block.dropped = True  # type: ignore[attr-defined]
        elif not calls:
            block.invalid = True
        else:
            for c in calls:
                block.calls.append(CallState(c.name, self.dump(c.args), True, c.start, c.end))

    def _close(self, blk: Block, out: list[str]) -> None:
        """A dropped region (see :attr:`Region.dropped`) leaves neither calls nor content; the
        whitespace trimmed before it is kept."""
        if getattr(blk, "dropped", False) and blk.end is not None:
            self._put(out, blk.pre_ws)
            self._leave(blk, blk.end)
            return
        super()._close(blk, out)


# --------------------------------------------------------------------------- invoke / parameter


@dataclass(frozen=True)
class InvokeFormat(XmlFormat):
    """``<NSinvoke name="f"><NSparameter name="k">v</NSparameter></NSinvoke>`` calls.

    ``blocks``: ``(open, closes)`` wrappers holding invokes separated by whitespace; a block is
    one region (a malformed invoke leaves the block content; an unknown tool leaves its invoke
    content). ``bare``: invokes may also stand alone, each its own region. An invoke may be
    self-closing (``<invoke name="f"/>``, a call without arguments). ``invoke``/``param``:
    accepted tag names (open and close may mix alternatives). ``call_wrap``: ``(begin, sep,
    end)`` around each invoke, with the type ``function`` before ``sep`` (Step3).
    ``string_attr``: ``string="true"`` keeps the (prepared) raw text, ``"false"`` decodes JSON
    (DSML). ``json_body``: an invoke body may be a JSON object of arguments; ``block_json``: a
    block body may be one ``{"name", "arguments"}`` object (complete, it is read even when
    the end of the stream cut its block). ``strict``: the DeepSeek-V4 checks
    (``string`` flag present and boolean, no duplicate parameter, JSON must decode, arguments
    valid against the schema). ``check_params``: unknown, duplicate or missing required
    parameters make the call malformed (MiniCPM).
    """

    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    invoke: tuple[str, ...] = ("invoke",)
    param: tuple[str, ...] = ("parameter",)
    bare: bool = False
    call_wrap: tuple[str, str, str] | None = None
    string_attr: bool = False
    json_body: bool = False
    block_json: bool = False
    strict: bool = False
    check_params: bool = False
    typing: ValueTyping = ValueTyping(typed="schema", untyped="json", null_word=True)
    unknown: str = "content"
    compact: bool = False
    drop_markers: tuple[str, ...] = ()
    framing_tokens: bool = False

    @property
    def openers(self) -> tuple[str, ...]:
        bare = tuple("<" + t for t in self.invoke) if self.bare else ()
        return tuple(o for o, _ in self.blocks) + bare

    def closers(self, opener: str) -> tuple[str, ...]:
        for o, closes in self.blocks:
            if o == opener:
                return closes
        return tuple("</" + t + ">" for t in self.invoke)

    def region(
        self, ctx: ToolContext, text: str, start: int, opener: str, final: bool, scan: int
    ) -> Region | None:
        if opener not in dict(self.blocks):  # a bare ``<invoke`` must be followed by a space
            n = start + len(opener)
            if n >= len(text):
                return Region(None, None) if final else None
            if text[n] not in _WS:
                return Region(None, None)
            gt = text.find(">", n)
            if gt < 0 and not final:
                return None
            if gt > 0 and text[gt - 1] == "/":  # ``<invoke name="f"/>``: no arguments
                call = self._invoke_rest(ctx, text[n : gt - 1] + ">")
                return Region(gt + 1, None if call is None else [ParsedCall(*call)])
        r = super().region(ctx, text, start, opener, final, scan)
        if r is not None and r.end is None and self.block_json:  # cut by the end of the stream:
            body = text[start + len(opener) :]  # a complete JSON call body still counts
            calls = json_calls(body) if body.strip().startswith("{") else None
            if calls:
                return Region(len(text), calls)
        return r

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        if opener not in dict(self.blocks):
            call = self._invoke_rest(ctx, body)
            return None if call is None else [ParsedCall(*call)]
        return _body_calls(body, at, self.block_json, lambda b, p: self._wrapped_invoke(ctx, b, p))

    def _wrapped_invoke(
        self, ctx: ToolContext, body: str, pos: int
    ) -> tuple[tuple[str, dict[str, Any]], int] | None:
        if self.call_wrap is None:
            return self._invoke_at(ctx, body, pos)
        begin, sep, end = self.call_wrap
        s = body.find(sep, pos)
        if not body.startswith(begin, pos) or s < 0:
            return None
        if body[pos + len(begin) : s].strip() != "function":
            return None
        found = self._invoke_at(ctx, body, skip_ws(body, s + len(sep)))
        if found is None:
            return None
        call, after = found
        after = skip_ws(body, after)
        return (call, after + len(end)) if body.startswith(end, after) else None

    def _invoke_at(
        self, ctx: ToolContext, body: str, pos: int
    ) -> tuple[tuple[str, dict[str, Any]], int] | None:
        tag = open_tag_at(body, pos, self.invoke)
        if tag is None:
            return None
        gt = body.find(">", pos)
        if gt > 0 and body[gt - 1] == "/":  # self-closing ``<invoke name="f"/>``: no arguments
            call = self._invoke_rest(ctx, body[pos + 1 + len(tag) : gt - 1] + ">")
            return None if call is None else (call, gt + 1)
        j, close = earliest(body, tuple("</" + t + ">" for t in self.invoke), pos)
        if j < 0:
            return None
        call = self._invoke_rest(ctx, body[pos + 1 + len(tag) : j])
        return None if call is None else (call, j + len(close))

    def _invoke_rest(self, ctx: ToolContext, rest: str) -> tuple[str, dict[str, Any]] | None:
        """``rest``: an invoke after ``<tag`` up to (without) its close tag."""
        gt = rest.find(">")
        if gt < 0:
            return None
        name = parse_attrs(rest[:gt]).get("name", "").strip()
        inner = rest[gt + 1 :]
        if not name:
            return None
        args: dict[str, Any] | None
        if self.json_body and inner.strip().startswith("{"):
            obj = _json(inner.strip())
            args = obj if isinstance(obj, dict) else None
        else:
            args = self._params(ctx, name, inner)
        if args is None:
            return None
        if self.strict and name in ctx.tool_names:
            return (name, args) if validate_arguments(args, ctx.tool_schema(name)) else None
        return name, args

    def _params(self, ctx: ToolContext, name: str, inner: str) -> dict[str, Any] | None:
        args: dict[str, Any] = {}
        closes = tuple("</" + t + ">" for t in self.param)
        pos = skip_ws(inner, 0)
        while pos < len(inner):
            tag = open_tag_at(inner, pos, self.param)
            gt = inner.find(">", pos)
            if tag is None or gt < 0:
                return None
            j, close = earliest(inner, closes, gt)
            if j < 0:
                return None
            attrs = parse_attrs(inner[pos + 1 + len(tag) : gt])
            key = attrs.get("name", "").strip()
            if not key or ((self.strict or self.check_params) and key in args):
                return None
            value = self._value(ctx, name, key, attrs.get("string"), inner[gt + 1 : j])
            if value is _MISSING:
                return None
            args[key] = value
            pos = skip_ws(inner, j + len(close))
        if self.check_params and not self._params_ok(ctx, name, args):
            return None
        return args

    def _value(self, ctx: ToolContext, name: str, key: str, flag: str | None, raw: str) -> Any:
        if self.string_attr and flag is not None:
            flag = flag.strip().lower()
            if flag == "true":
                return self.typing.prepare(raw)
            if flag == "false":
                value = _json(raw.strip())
                if value is not _MISSING or self.strict:
                    return value
                return self.typing.prepare(raw)
        if self.strict:
            return _MISSING
        return self.value(ctx, name, key, raw)

    @staticmethod
    def _params_ok(ctx: ToolContext, name: str, args: dict[str, Any]) -> bool:
        params = ctx.tool_schema(name)
        props = params.get("properties") or {}
        required = params.get("required") or ()
        return all(k in props for k in args) and all(k in args for k in required)


# --------------------------------------------------------------------------- <function=...>

_DRIFTED_CLOSE = re.compile(r"</parameter[\w-]*>?")


def _drop_drifted_close(raw: str) -> str:
    """An unclosed value (it ends at the next parameter or at ``</function>``) without the
    close marker the model drifted into (``</parameter1>``, ``</parameter_x>``, a bare
    ``</parameter``), as SGLang strips it. A value closed by a real ``</parameter>`` is kept
    whole, whatever it ends with."""
    body = raw.rstrip()
    at = body.rfind("</parameter")
    if at >= 0 and _DRIFTED_CLOSE.fullmatch(body, at):
        return body[:at].rstrip() + raw[len(body):]
    return raw


def _drop_partial_close(body: str, closes: tuple[str, ...]) -> str:
    """``body`` without a close marker cut by the end of the stream (``</tool_c``)."""
    at = body.rfind("</")
    if at >= 0 and any(c.startswith(body[at:]) for c in closes):
        return body[:at]
    return body


@dataclass(frozen=True)
class FunctionFormat(XmlFormat):
    """``<tool_call><function=f><parameter=k>v</parameter></function></tool_call>`` calls.

    One or more functions per ``<tool_call>`` block (one region). A parameter ends at
    ``</parameter>``, at the next ``<parameter=``, or at ``</function>`` (then without a
    drifted close such as ``</parameter1>`` at its end). ``json_body``: the
    block body may instead be a JSON ``{"name", "arguments"}`` object (Nanbeige). ``repair``
    (Step-3.5): ``<function f>``/``<parameter k>`` with a space, ``<functionf>`` without one
    for a declared tool, a header closed by a newline instead of ``>``, a doubled
    ``<parameter=parameter=k``, a missing ``</function>``, a bare ``<function=...></function>``
    (a ``</tool_call>`` right after it is part of it), and a ``<tool_call>`` cut by the end of
    the stream once its function header is complete.
    """

    wrapper: tuple[str, str] = ("<tool_call>", "</tool_call>")
    json_body: bool = False
    repair: bool = False
    typing: ValueTyping = ValueTyping(trim="newline", typed="schema", untyped="raw", null_word=True)
    unknown: str = "content"
    compact: bool = False
    drop_markers: tuple[str, ...] = ()

    @property
    def openers(self) -> tuple[str, ...]:
        return (self.wrapper[0], "<function=") if self.repair else (self.wrapper[0],)

    def closers(self, opener: str) -> tuple[str, ...]:
        return (self.wrapper[1],) if opener == self.wrapper[0] else ("</function>",)

    def region(
        self, ctx: ToolContext, text: str, start: int, opener: str, final: bool, scan: int
    ) -> Region | None:
        if not self.repair:
            return super().region(ctx, text, start, opener, final, scan)
        body_at = start + len(opener)
        if opener == self.wrapper[0]:
            r = super().region(ctx, text, start, opener, final, scan)
            if r is None or r.end is not None:
                return r
            # cut by the end of the stream: a call whose function header is complete is kept
            body = _drop_partial_close(text[body_at:], (self.wrapper[1], "</function>",
                                                        "</parameter>"))
            return Region(len(text), self.parse(ctx, opener, body, body_at))
        j = text.find("</function>", body_at)  # a bare function (rare: searched whole)
        if j < 0:
            return Region(None, None) if final else None
        end = j + len("</function>")
        k = skip_ws(text, end)
        if text.startswith(self.wrapper[1], k):  # the close of a wrapper it was written without
            end = k + len(self.wrapper[1])
        elif not final and self.wrapper[1].startswith(text[k:]):
            return None
        return Region(end, self.parse(ctx, opener, text[body_at:j], body_at))

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        if opener != self.wrapper[0]:  # a bare repaired function: body follows "<function="
            found = self._function(ctx, "<function=" + body + "</function>", 0)
            return None if found is None else [ParsedCall(*found[0])]
        return _body_calls(body, at, self.json_body, lambda b, p: self._function(ctx, b, p))

    def _header(
        self, text: str, pos: int, word: str, names: Any = ()
    ) -> tuple[str, int] | None:
        """``<word=X>`` (or repaired forms) at ``pos`` -> (X, index after the header);
        ``names``: declared names that may follow ``<word`` without a separator (repair)."""
        seps = "= " if self.repair else "="
        k = pos + len(word) + 2
        if not text.startswith("<" + word, pos) or k > len(text):
            return None
        if text[k - 1] not in seps:
            for name in names if self.repair else ():
                if isinstance(name, str) and name and text.startswith(name, k - 1):
                    after = k - 1 + len(name)
                    if text[after : after + 1] in (">", "\n"):
                        return name, after + 1
            return None
        gt = text.find(">", k)
        nl = text.find("\n", k) if self.repair else -1
        if nl >= 0 and (gt < 0 or nl < gt):
            return text[k:nl].strip(), nl + 1
        return (text[k:gt].strip(), gt + 1) if gt >= 0 else None

    def _function(
        self, ctx: ToolContext, body: str, pos: int
    ) -> tuple[tuple[str, dict[str, Any]], int] | None:
        head = self._header(body, pos, "function", ctx.tool_names)
        if head is None or not head[0]:
            return None
        name, i = head
        close = body.find("</function>", i)
        if close < 0 and not self.repair:
            return None
        stop = close if close >= 0 else len(body)
        args = self._params(ctx, name, body[i:stop])
        if args is None:
            return None
        return (name, args), (stop + len("</function>") if close >= 0 else stop)

    def _params(self, ctx: ToolContext, name: str, inner: str) -> dict[str, Any] | None:
        args: dict[str, Any] = {}
        ends = ("</parameter>", "<parameter=", "<parameter ") if self.repair else (
            "</parameter>", "<parameter=")
        pos = skip_ws(inner, 0)
        while pos < len(inner):
            head = self._header(inner, pos, "parameter")
            if head is None or not head[0]:
                return None
            key, i = head
            while self.repair and key[:10] in ("parameter=", "parameter "):  # a doubled prefix
                key = key[10:].strip()
            j, end = earliest(inner, ends, i)
            j = len(inner) if j < 0 else j
            raw = inner[i:j] if end == "</parameter>" else _drop_drifted_close(inner[i:j])
            args[key] = self.value(ctx, name, key, raw)
            pos = skip_ws(inner, j + len(end) if end == "</parameter>" else j)
        return args


# --------------------------------------------------------------------------- <arg_key>/<arg_value>


@dataclass(frozen=True)
class ArgPairFormat(XmlFormat):
    """``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`` calls.

    ``call``: the per-call tags (each call is a region); ``group``: an optional wrapper holding
    calls separated by whitespace (one region; a malformed call fails the whole group).
    ``name_end``: how the name ends: ``"newline"`` (a newline or a literal ``\\n`` is required,
    GLM-4.5), ``"key"`` (the text before the first key, GLM-4.7), ``"flex"`` (a newline, the
    first key, or the end of the call), ``"sep"`` (the ``sep`` marker, Hunyuan),
    ``"sep_or_key"`` (the ``sep`` marker, else as ``"key"``: Hunyuan HY4). The body after
    the name must be pairs separated by whitespace; ``adjacent``: no whitespace between a key
    and its value (Spark); ``lenient``: a key without a value is dropped (Poolside);
    ``type_tag``: an optional inline type between key and value (K2 Horizon); ``json_body``:
    the body may be a JSON call object or a list of them.
    """

    call: tuple[str, str] = ("<tool_call>", "</tool_call>")
    group: tuple[str, str] | None = None
    key: tuple[str, str] = ("<arg_key>", "</arg_key>")
    val: tuple[str, str] = ("<arg_value>", "</arg_value>")
    type_tag: tuple[str, str] | None = None
    name_end: str = "newline"
    sep: str = ""
    adjacent: bool = False
    lenient: bool = False
    json_body: bool = False
    typing: ValueTyping = ValueTyping()
    unknown: str = "content"
    compact: bool = False
    drop_markers: tuple[str, ...] = ()

    @property
    def openers(self) -> tuple[str, ...]:
        return ((self.group[0],) if self.group else ()) + (self.call[0],)

    def closers(self, opener: str) -> tuple[str, ...]:
        return (self.group[1],) if self.group and opener == self.group[0] else (self.call[1],)

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        if opener == self.call[0]:
            return self._call(ctx, body)
        calls: list[ParsedCall] = []
        pos = skip_ws(body, 0)
        while pos < len(body):
            j = body.find(self.call[1], pos)
            if not body.startswith(self.call[0], pos) or j < 0:
                return None
            found = self._call(ctx, body[pos + len(self.call[0]) : j])
            if found is None:
                return None
            end = j + len(self.call[1])
            calls += [ParsedCall(c.name, c.args, at + pos, at + end) for c in found]
            pos = skip_ws(body, end)
        return calls or None

    def _call(self, ctx: ToolContext, body: str) -> list[ParsedCall] | None:
        if self.json_body and body.strip()[:1] in ("{", "["):
            return json_calls(body, lists=True)
        split = self._name(body)
        if split is None:
            return None
        name, rest = split
        args = self._pairs(ctx, name, rest)
        return None if args is None else [ParsedCall(name, args)]

    def _name(self, body: str) -> tuple[str, str] | None:
        if self.name_end in ("sep", "sep_or_key"):
            k, m = body.find(self.sep), self.sep
            if k < 0 and self.name_end == "sep_or_key":  # no marker: the first key or the end
                k, m = body.find(self.key[0]), ""
                k = len(body) if k < 0 else k
        elif self.name_end == "key":
            k, m = body.find(self.key[0]), ""
            k = len(body) if k < 0 else k
        elif self.name_end == "newline":
            k, m = earliest(body, ("\n", "\\n"), 0)
        else:
            k, m = earliest(body, ("\n", self.key[0]), 0)
            m = "" if m == self.key[0] else m
            if k < 0:
                k = len(body)
        if k < 0:
            return None
        return body[:k].strip(), body[k + len(m) :]

    def _pairs(self, ctx: ToolContext, name: str, rest: str) -> dict[str, Any] | None:
        args: dict[str, Any] = {}
        key: str | None = None
        hint: str | None = None
        pos = skip_ws(rest, 0)
        while pos < len(rest):
            if rest.startswith(self.key[0], pos):
                j = rest.find(self.key[1], pos)
                if j < 0 or (key is not None and not self.lenient):
                    return None
                key, hint = rest[pos + len(self.key[0]) : j].strip(), None
                pos = j + len(self.key[1])
                pos = pos if self.adjacent else skip_ws(rest, pos)
                if self.type_tag and rest.startswith(self.type_tag[0], pos):
                    j = rest.find(self.type_tag[1], pos)
                    if j < 0:
                        return None
                    hint = rest[pos + len(self.type_tag[0]) : j].strip()
                    pos = j + len(self.type_tag[1])
                    pos = pos if self.adjacent else skip_ws(rest, pos)
                continue
            j = rest.find(self.val[1], pos)
            if key is None or j < 0 or not rest.startswith(self.val[0], pos):
                return None
            args[key] = self.value(ctx, name, key, rest[pos + len(self.val[0]) : j], hint)
            key = None
            pos = skip_ws(rest, j + len(self.val[1]))
        return None if key is not None and not self.lenient else args

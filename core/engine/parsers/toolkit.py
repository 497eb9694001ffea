"""Machinery for tool-call parsers: a streaming base class, canonical arguments, JSON streamers.

Standard library only. Everything here is format-agnostic; formats are described by subclasses.

How a format plugs in
=====================
Subclass :class:`StreamingToolParser` and give it:

``start_markers`` (class attribute, tuple of str)
    Texts that open a *block*: one region of model text holding one or more calls (a
    ``<tool_call>...</tool_call>`` unit, a whole ``<|tool_calls_section_begin|>...`` section...).
    Text outside blocks is content. A trailing partial prefix of a marker is held back while
    streaming. If one marker is a prefix of another, the longer one wins (the base waits until
    it can tell).
``drop_markers`` (optional tuple of str)
    Texts removed wherever they occur outside blocks (stray closing tags).
``trim_whitespace`` (bool, default True)
    Whitespace right before a surfaced block and right after it is trimmed
    (``"Sure.\\n<tool_call>...</tool_call>\\n"`` yields ``"Sure."``). A response without calls
    is returned unchanged. False: the text around blocks is kept verbatim (only the blocks
    themselves are removed).
``framing_tokens`` (bool, default False)
    The markers are control tokens, never prose: when a block is rejected (its payload cannot
    be read), its start marker and any drop marker inside it are left out of the content, and
    the payload stays (``<tool_call>not json</tool_call>`` gives ``not json``).
``cut_prefixes`` (optional tuple of str)
    For formats whose markers span several tokens, so that ``max_tokens`` can stop inside one:
    at the end of the stream, held-back text that is a prefix of a marker and starts with one
    of these (``"<|open|>"``) is a cut marker, dropped instead of returned as content.
``join_with_whitespace`` (bool, default True)
    With ``trim_whitespace``: when content comes both before and after one or more blocks,
    the whitespace that separated them is kept, one run of it (the whitespace after the last
    block, else the one before it), so words are never glued: ``"Hi <call> bye"`` yields
    ``"Hi bye"``, ``"Hi\\n<call>bye"`` yields ``"Hi\\nbye"``. False glues them (``"Hibye"``).
``advance(self, text, block, final) -> None`` (required)
    Called with the whole buffer ``text`` (the block starts at ``block.start``, its marker is
    ``block.marker``; ``block.scan`` starts just after the marker and is yours to keep a resume
    offset so each call examines only new text). Describe what is known by mutating ``block``:

    * append a :class:`CallState` to ``block.calls`` per call as soon as it begins; set its
      ``name`` once the name is complete (the base validates it against ``tools`` and emits the
      first delta ``(index, name, arguments-so-far)``); grow its ``arguments`` with the settled
      canonical prefix (never rewrite what is there: the base streams the growth); set
      ``done = True`` when ``arguments`` is the complete canonical text. For blocks holding
      several calls set each call's raw ``start``/``end`` offsets (needed to return an unknown
      call's text as content, and to keep the calls before a malformed one).
    * set ``block.end`` (index just past the block) when the block is complete, or
      ``block.invalid = True`` when the text is not a well-formed block. On invalid, calls already
      done stay; the rest from the end of the last done call (or the start marker itself, when
      none is done) becomes content and scanning resumes after it. If you also set ``block.end``
      on an invalid block with no done call, the whole ``text[start:end]`` becomes content, or
      ``block.replace`` when set (a malformed block whose framing is not content).
    * a block may also hold no call: set ``block.end`` and ``block.replace`` (the content it
      stands for, e.g. ``""``) to consume framing text.
    * ``final`` is True once the stream has ended: complete the block if the format allows an
      unterminated end; a block still open after a final ``advance`` is treated as invalid.

    Decisions must not depend on how the text was chunked: only decide what the text seen so far
    settles (e.g. set a name only once its terminator has arrived), and publish what the text
    settles (a complete name) before marking the block invalid in the same call, so a whole
    parse surfaces exactly what a fine-grained stream would have.
``find_start(self, text, pos)`` / ``hold_from(self, text, pos)`` (optional)
    Override to recognise starts that are not fixed markers (e.g. a response opening with
    ``{``). ``find_start`` returns ``(index, marker)`` of the earliest block start at or after
    ``pos`` or None; ``hold_from`` returns where held-back text (a possible partial start) begins.

The base keeps a settled offset (text before it is never re-examined), trims its buffer when
outside blocks, and implements ``feed``/``finish``/``parse`` (``parse`` = one feed + finish on
this fresh instance, so whole and streamed results agree by construction).

Documented asymmetry (inherent in incremental streaming): once a call's name has been emitted,
deltas cannot be withdrawn. If that call later turns out malformed or the stream ends inside it,
streaming has emitted its name (and maybe argument fragments) while ``parse`` omits it; both
return its raw text as content. Formats that emit a call only when complete have no asymmetry.

Example (atomic JSON in tags; :class:`TaggedBlockParser` does exactly this generically)::

    class Tagged(StreamingToolParser):
        start_markers = ("<call>",)

        def advance(self, text, block, final):
            end = text.find("</call>", block.scan)
            if end < 0:
                block.scan = max(block.scan, len(text) - len("</call>") + 1)
                return
            block.end = end + len("</call>")
            obj = loads_object(text[block.start + len(block.marker) : end])
            if obj is None or not isinstance(obj.get("name"), str):
                block.invalid = True
                return
            args = obj.get("arguments", {})
            block.calls.append(CallState(name=obj["name"], arguments=self.dump(args), done=True))

Incremental arguments: feed raw JSON to a :class:`JsonStreamer` (copy its settled ``out``) or
a whole ``{"name": ..., "arguments": ...}`` object to a :class:`JsonCallStreamer` (copy its
``name`` and ``arguments``) into the :class:`CallState`; formats that produce key/value pairs
(XML) use :class:`PairArgumentsStreamer`. :func:`skip_ws` and :func:`match_token` help scanning.
Ready-made JSON formats built this way are in :mod:`engine.parsers.json_tools`.
"""

from __future__ import annotations

import json
import math
import re
from abc import abstractmethod
from json.encoder import encode_basestring
from typing import Any

from engine.parsers.base import ToolCall, ToolCallDelta, ToolDelta, ToolParser, ToolResult

__all__ = [
    "Block",
    "CallState",
    "JsonCallStreamer",
    "JsonStreamer",
    "PairArgumentsStreamer",
    "PassThroughToolParser",
    "StreamingToolParser",
    "TaggedBlockParser",
    "dump_arguments",
    "finite",
    "loads_json",
    "loads_object",
    "match_token",
    "next_token",
    "skip_ws",
]


_WS = " \t\n\r"


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (``inf``, ``nan``) replaced by a string
    (``"Infinity"``, ``"-Infinity"``, ``"NaN"``): JSON has no such numbers, and arguments must
    always be valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return json.dumps(obj)
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dump_arguments(obj: Any, compact: bool = False) -> str:
    """The canonical arguments text: ``json.dumps(obj, ensure_ascii=False)``; ``compact`` uses
    the separators ``,`` and ``:``. Always valid JSON: non-finite numbers are written as
    strings (see :func:`finite`)."""
    seps = (",", ":") if compact else (", ", ": ")
    try:
        return json.dumps(obj, ensure_ascii=False, separators=seps, allow_nan=False)
    except ValueError:
        return json.dumps(finite(obj), ensure_ascii=False, separators=seps)


def _float_or_text(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else text


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def loads_json(text: str) -> Any:
    """``json.loads`` of model text with the parsers' number rules: ``NaN``/``Infinity`` are
    not JSON (ValueError), and a number too large for a float (``1e999``) is kept as the string
    of its text, as a typed parameter that fails to convert is."""
    return json.loads(text, parse_float=_float_or_text, parse_constant=_no_constant)


def loads_object(text: str) -> dict[str, Any] | None:
    """:func:`loads_json` of a JSON object text, or None when it is not one (never raises)."""
    try:
        obj = loads_json(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace (``len(text)`` if none)."""
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def match_token(text: str, i: int, token: str, final: bool) -> int | None:
    """Whether ``token`` is at ``i``: the index just past it; ``-1`` when it is not (and cannot
    become so); ``None`` when the text ends with a proper prefix of it and more may come."""
    if text.startswith(token, i):
        return i + len(token)
    rest = text[i:]
    if not final and len(rest) < len(token) and token.startswith(rest):
        return None
    return -1


def close_block_after(text: str, block: "Block", call: "CallState", token: str,
                      final: bool) -> None:
    """End ``block`` after its finished last ``call``: past ``token`` when it follows (after
    whitespace from ``block.scan``), at the call's end when something else does (the rest is
    content); unchanged while the text may still grow into ``token``."""
    j = match_token(text, skip_ws(text, block.scan), token, final)
    if j is not None:
        block.end = call.end = j if j >= 0 else call.end


def _escape(s: str) -> str:
    """JSON string body (no quotes) exactly as ``json.dumps(..., ensure_ascii=False)`` writes it."""
    return encode_basestring(s)[1:-1]


# --------------------------------------------------------------------------- JSON streamers

_STR_STOP = re.compile(r'["\\]')
_NUM_CHARS = frozenset("0123456789+-.eE")
_NUM_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_SIMPLE_ESC = {
    '"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"
}
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = ("true", "false", "null")

# parser states
_VALUE, _ARR_FIRST, _KEY_FIRST, _KEY, _COLON, _AFTER, _STRING, _NUMBER, _LITERAL, _DONE, _FAIL = (
    range(11)
)


class JsonStreamer:
    """Reads one JSON value incrementally and writes its canonical serialization as it settles.

    ``feed(text, start, stop)`` consumes ``text[start:stop]`` and returns the index where reading
    stopped: just past the value once it is complete (``done``), at the offending character when
    the text is not JSON (``failed``), at an incomplete escape (feed again from there with more
    text), or ``stop``. ``out`` is the settled canonical prefix: it only grows, and once ``done``
    it equals ``dump_arguments(loads_json(raw), compact)`` (duplicate keys are kept as written).
    Raw control characters inside strings are tolerated (and escaped in ``out``); ``NaN`` and
    ``Infinity`` are not JSON here. ``require_object`` fails on any top-level value but an object.
    """

    def __init__(self, *, compact: bool = False, require_object: bool = True) -> None:
        self.out = ""
        self._item_sep, self._key_sep = (",", ":") if compact else (", ", ": ")
        self._require_object = require_object
        self._stack: list[str] = []
        self._state = _VALUE
        self._tok = ""
        self._is_key = False
        self._str_at = 0  # index in ``out`` of the current string's opening quote

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def failed(self) -> bool:
        return self._state == _FAIL

    # hooks for subclasses; called only for values directly inside the top-level container
    def _on_key(self, key: str) -> None:
        """A top-level object key has been read."""

    def _on_value_start(self) -> None:
        """A top-level member value begins (``out`` is not yet extended)."""

    def _on_value_end(self) -> None:
        """A top-level member value is complete (it is the tail of ``out``)."""

    def _value_done(self) -> None:
        stack = self._stack
        if not stack:
            self._state = _DONE
            return
        self._state = _AFTER
        if len(stack) == 1:
            self._on_value_end()

    def _fail(self) -> None:
        self._state = _FAIL

    def _close_container(self, ch: str) -> bool:
        """Write the innermost container's closing ``ch`` and pop it; whether the value is done."""
        self._stack.pop()
        self.out += ch
        self._value_done()
        return self._state == _DONE

    def feed(self, text: str, start: int = 0, stop: int | None = None) -> int:
        if stop is None:
            stop = len(text)
        if self._state == _DONE or self._state == _FAIL:
            return start
        i = start
        stack = self._stack
        while i < stop:
            st = self._state
            if st == _STRING:
                m = _STR_STOP.search(text, i, stop)
                j = m.start() if m else stop
                if j > i:
                    self.out += _escape(text[i:j])
                    i = j
                if m is None:
                    break
                if text[i] == '"':
                    self.out += '"'
                    i += 1
                    if self._is_key:
                        self._state = _COLON
                        if len(stack) == 1:
                            self._on_key(json.loads(self.out[self._str_at :]))
                    else:
                        self._value_done()
                    continue
                # a backslash escape
                if i + 1 >= stop:
                    break
                e = text[i + 1]
                if e in _SIMPLE_ESC:
                    self.out += _escape(_SIMPLE_ESC[e])
                    i += 2
                    continue
                if e != "u":
                    self._fail()
                    return i
                if i + 6 > stop:
                    break
                hx = text[i + 2 : i + 6]
                if not all(c in _HEX for c in hx):
                    self._fail()
                    return i
                code = int(hx, 16)
                if 0xD800 <= code < 0xDC00:
                    # a high surrogate pairs with a following \uDC00-\uDFFF escape
                    tail = text[i + 6 : min(stop, i + 12)]
                    if len(tail) < 6 and "\\u".startswith(tail[:2]):
                        break  # cannot tell yet
                    lo = tail[2:6]
                    if tail[:2] == "\\u" and all(c in _HEX for c in lo):
                        low = int(lo, 16)
                        if 0xDC00 <= low < 0xE000:
                            ch = chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
                            self.out += _escape(ch)
                            i += 12
                            continue
                self.out += _escape(chr(code))
                i += 6
                continue
            c = text[i]
            if st == _NUMBER:
                if c in _NUM_CHARS:
                    self._tok += c
                    i += 1
                    continue
                tok = self._tok
                if not _NUM_RE.match(tok):
                    self._fail()
                    return i
                value = json.loads(tok)
                # a number beyond float range (1e999) keeps its text, as a string
                self.out += json.dumps(value if isinstance(value, int) or math.isfinite(value)
                                       else tok)
                self._tok = ""
                self._value_done()
                continue
            if st == _LITERAL:
                tok = self._tok + c
                if not any(lit.startswith(tok) for lit in _LITERALS):
                    self._fail()
                    return i
                i += 1
                if tok in _LITERALS:
                    self.out += tok
                    self._tok = ""
                    self._value_done()
                    if self._state == _DONE:
                        return i
                else:
                    self._tok = tok
                continue
            if c in _WS:
                i += 1
                continue
            if st == _VALUE or st == _ARR_FIRST:
                if st == _ARR_FIRST and c == "]":
                    i += 1
                    if self._close_container("]"):
                        return i
                    continue
                if not stack and self._require_object and c != "{":
                    self._fail()
                    return i
                if len(stack) == 1:
                    self._on_value_start()
                i += 1
                if c == "{":
                    stack.append("{")
                    self.out += "{"
                    self._state = _KEY_FIRST
                elif c == "[":
                    stack.append("[")
                    self.out += "["
                    self._state = _ARR_FIRST
                elif c == '"':
                    self._str_at = len(self.out)
                    self.out += '"'
                    self._is_key = False
                    self._state = _STRING
                elif c == "-" or "0" <= c <= "9":
                    self._tok = c
                    self._state = _NUMBER
                elif c in "tfn":
                    self._tok = c
                    self._state = _LITERAL
                else:
                    self._fail()
                    return i - 1
                continue
            if st == _KEY_FIRST or st == _KEY:
                if c == '"':
                    self._str_at = len(self.out)
                    self.out += '"'
                    self._is_key = True
                    self._state = _STRING
                    i += 1
                    continue
                if st == _KEY_FIRST and c == "}":
                    i += 1
                    if self._close_container("}"):
                        return i
                    continue
                self._fail()
                return i
            if st == _COLON:
                if c != ":":
                    self._fail()
                    return i
                self.out += self._key_sep
                self._state = _VALUE
                i += 1
                continue
            if st == _AFTER:
                top = stack[-1]
                if c == ",":
                    self.out += self._item_sep
                    self._state = _KEY if top == "{" else _VALUE
                    i += 1
                    continue
                if (c == "}" and top == "{") or (c == "]" and top == "["):
                    i += 1
                    if self._close_container(c):
                        return i
                    continue
                self._fail()
                return i
            self._fail()  # unreachable states
            return i
        return i


class JsonCallStreamer(JsonStreamer):
    """Reads a call object such as ``{"name": "f", "arguments": {...}}`` incrementally.

    ``name`` is set once the name string is complete; ``arguments`` is the settled canonical
    prefix of the arguments object (``"{}"`` when the object has none, once ``done``). The first
    of ``args_keys`` present wins; an arguments value that is a JSON string holding an object is
    decoded (it settles at once when complete). ``invalid`` is set when the name is not a string
    or the arguments are not an object.
    """

    def __init__(
        self,
        *,
        name_keys: tuple[str, ...] = ("name",),
        args_keys: tuple[str, ...] = ("arguments", "parameters"),
        compact: bool = False,
    ) -> None:
        super().__init__(compact=compact, require_object=True)
        self._compact = compact
        self._name_keys = name_keys
        self._args_keys = args_keys
        self.name: str | None = None
        self.invalid = False
        self._key: str | None = None
        self._cur: str | None = None  # "name" / "args" while that value is being read
        self._name_at = 0
        self._args_at: int | None = None
        self._args_text: str | None = None  # final arguments once known

    def _on_key(self, key: str) -> None:
        self._key = key

    def _on_value_start(self) -> None:
        k = self._key
        if k in self._name_keys and self.name is None and self._cur is None:
            self._cur = "name"
            self._name_at = len(self.out)
        elif k in self._args_keys and self._args_at is None:
            self._cur = "args"
            self._args_at = len(self.out)

    def _on_value_end(self) -> None:
        cur, self._cur = self._cur, None
        if cur == "name":
            value = json.loads(self.out[self._name_at :])
            if isinstance(value, str):
                self.name = value
            else:
                self.invalid = True
        elif cur == "args":
            raw = self.out[self._args_at :]
            if raw.startswith("{"):
                self._args_text = raw
                return
            value = json.loads(raw)
            obj = loads_object(value) if isinstance(value, str) else None
            if obj is None:
                self.invalid = True
            else:
                self._args_text = dump_arguments(obj, self._compact)

    @property
    def arguments(self) -> str:
        if self._args_text is not None:
            return self._args_text
        if self._args_at is None:
            return "{}" if self.done else ""
        raw = self.out[self._args_at :]
        return raw if raw.startswith("{") else ""


class PairArgumentsStreamer:
    """Builds canonical arguments from key/value pairs as they complete (XML-style formats).

    Every method returns the fragment it added; ``text`` is everything so far. Per pair, either
    ``add(key, value)``, or ``key(k)`` then ``value(v)`` (any JSON value), or ``key(k)`` then
    ``string(part)`` any number of times then ``end_string()`` to stream a string value as it
    arrives. ``close()`` appends ``}`` (``{}`` when there were no pairs); then ``text`` equals
    ``dump_arguments(dict(pairs), compact)`` when keys are distinct (duplicates are written as
    they come). Use the same streamer in ``parse`` and in streaming so both agree.
    """

    def __init__(self, compact: bool = False) -> None:
        self.text = ""
        self._item_sep, self._key_sep = (",", ":") if compact else (", ", ": ")
        self._in_string = False
        self.closed = False

    def _put(self, s: str) -> str:
        self.text += s
        return s

    def key(self, key: str) -> str:
        lead = "{" if not self.text else self._item_sep
        return self._put(lead + json.dumps(key, ensure_ascii=False) + self._key_sep)

    def value(self, value: Any) -> str:
        seps = (self._item_sep, self._key_sep)
        return self._put(json.dumps(finite(value), ensure_ascii=False, separators=seps))

    def add(self, key: str, value: Any) -> str:
        return self.key(key) + self.value(value)

    def string(self, part: str) -> str:
        lead = "" if self._in_string else '"'
        self._in_string = True
        return self._put(lead + _escape(part))

    def end_string(self) -> str:
        lead = "" if self._in_string else '"'
        self._in_string = False
        return self._put(lead + '"')

    def close(self) -> str:
        self.closed = True
        return self._put("}" if self.text else "{}")


# --------------------------------------------------------------------------- streaming base


class CallState:
    """What is known about one call inside a block (mutated by ``advance``).

    ``name``: set once complete. ``arguments``: settled canonical prefix, only ever extended.
    ``done``: ``arguments`` is complete. ``start``/``end``: raw offsets of the call in the
    buffer (for multi-call blocks). ``index``/``rejected``/``sent`` are managed by the base.
    """

    __slots__ = ("name", "arguments", "done", "start", "end", "index", "rejected", "sent", "data")

    def __init__(
        self,
        name: str | None = None,
        arguments: str = "",
        done: bool = False,
        start: int | None = None,
        end: int | None = None,
    ) -> None:
        self.name = name
        self.arguments = arguments
        self.done = done
        self.start = start
        self.end = end
        self.index: int | None = None
        self.rejected = False
        self.sent = 0
        self.data: Any = None  #: free slot for the subclass (e.g. its streamer)


class Block:
    """One region opened by a start marker. ``advance`` may add its own attributes."""

    def __init__(self, start: int, marker: str) -> None:
        self.start = start
        self.marker = marker
        self.scan = start + len(marker)  #: the subclass's resume offset
        self.calls: list[CallState] = []
        self.end: int | None = None
        self.invalid = False
        self.pre_ws = ""  #: whitespace trimmed before the block (restored if it is content)
        #: when set, a block closing without surfaced calls yields this content instead of its
        #: raw text (e.g. ``""`` to consume framing such as a channel header)
        self.replace: str | None = None


def next_token(
    text: str, block: Block, tokens: tuple[str, ...], final: bool
) -> tuple[int, str, int] | None:
    """Which of ``tokens`` comes next in a block's call sequence (after whitespace from
    ``block.scan``): ``(where, token, index after it)``. ``None`` tells ``advance`` to return:
    more text may decide it, or none of them is there, and then the block ends after its last
    call (when the text ends right there) or is malformed."""
    i = skip_ws(text, block.scan)
    for tok in tokens:
        j = match_token(text, i, tok, final)
        if j is None:
            return None
        if j >= 0:
            return i, tok, j
    if final and i >= len(text) and block.calls:
        block.end = block.calls[-1].end
    else:
        block.invalid = True
    return None


class StreamingToolParser(ToolParser):
    """Base of format-describing tool parsers; see the module docstring for how to subclass.

    ``compact`` selects the compact canonical separators for :meth:`dump`.
    """

    start_markers: tuple[str, ...] = ()
    drop_markers: tuple[str, ...] = ()
    cut_prefixes: tuple[str, ...] = ()
    framing_tokens: bool = False
    trim_whitespace: bool = True
    join_with_whitespace: bool = True
    compact: bool = False

    def __init__(self, *, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools=tools)
        self._buf = ""
        self._pos = 0
        self._block: Block | None = None
        self._after_block = False
        self._has_content = False  # non-whitespace content has been emitted
        self._tail = ""  # the last character of content emitted so far
        self._gap = ""  # whitespace trimmed around blocks, owed before the next content
        self._next_index = 0
        self._completed: dict[int, ToolCall] = {}
        self._all_markers = tuple(self.start_markers) + tuple(self.drop_markers)

    # ------------------------------------------------------------------ subclass interface

    @abstractmethod
    def advance(self, text: str, block: Block, final: bool) -> None:
        """Examine ``text`` from ``block.scan``; record calls, ``end`` or ``invalid``."""

    def dump(self, obj: Any) -> str:
        """Canonical arguments of this format."""
        return dump_arguments(obj, self.compact)

    def find_start(self, text: str, pos: int) -> tuple[int, str] | None:
        """Earliest ``(index, marker)`` of a start or drop marker at or after ``pos``."""
        best: tuple[int, str] | None = None
        for m in self._all_markers:
            i = text.find(m, pos, len(text) if best is None else best[0] + len(m))
            if i == -1:
                continue
            if best is None or i < best[0] or (i == best[0] and len(m) > len(best[1])):
                best = (i, m)
        return best

    def hold_from(self, text: str, pos: int) -> int:
        """Where a trailing partial marker begins (``len(text)`` when there is none)."""
        n = len(text)
        best = n
        for m in self._all_markers:
            i = text.find(m[0], max(pos, n - len(m) + 1))
            while i != -1 and i < best:
                if m.startswith(text[i:]):
                    best = i
                    break
                i = text.find(m[0], i + 1)
        return best

    # ------------------------------------------------------------------ ToolParser

    def feed(self, chunk: str) -> ToolDelta:
        self._buf += chunk
        return self._step(False)

    def finish(self) -> ToolDelta:
        return self._step(True)

    def parse(self, text: str) -> ToolResult:
        a = self.feed(text)
        b = self.finish()
        calls = [self._completed[i] for i in sorted(self._completed)]
        return ToolResult(content=a.content + b.content, calls=calls)

    # ------------------------------------------------------------------ engine

    def _step(self, final: bool) -> ToolDelta:
        out: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            blk = self._block
            if blk is None:
                self._outside(final, out)
                if self._block is None:
                    break
                continue
            self.advance(self._buf, blk, final)
            self._surface(blk, deltas)
            if blk.end is not None and not blk.invalid:
                if all(c.rejected or (c.name is not None and c.done) for c in blk.calls):
                    self._close(blk, out)
                    continue
                blk.invalid = True  # ended with an unnamed or unfinished call
            if blk.invalid or final:
                self._abandon(blk, out)
                continue
            break
        return ToolDelta(content="".join(out), calls=deltas)

    def _put(self, out: list[str], text: str) -> None:
        """Emit content ``text``: the separator trimmed around blocks comes first when content
        came before and ``text`` would otherwise be glued to it."""
        if not text:
            return
        if text.strip(_WS):
            if (self._gap and self.join_with_whitespace and self._has_content
                    and text[0] not in _WS and self._tail not in _WS):
                out.append(self._gap)
            self._gap = ""
            self._has_content = True
        out.append(text)
        self._tail = text[-1]

    def _owe(self, ws: str) -> None:
        """Whitespace trimmed at a block boundary: remembered as the separator."""
        if ws:
            self._gap = ws

    def _outside(self, final: bool, out: list[str]) -> None:
        buf, pos = self._buf, self._pos
        while True:
            if self._after_block and self.trim_whitespace:
                # whitespace after a block: trimmed and remembered as the separator owed to
                # the next content (see ``join_with_whitespace``)
                n, j = len(buf), pos
                while j < n and buf[j] in _WS:
                    j += 1
                if j < n or final:
                    self._after_block = False
                    self._owe(buf[pos:j])
                    pos = j
                else:
                    self._buf = buf[pos:]
                    self._pos = 0
                    return
            found = self.find_start(buf, pos)
            if found is not None:
                i, marker = found
                if not final and any(
                    len(m) > len(marker) and m.startswith(buf[i:]) for m in self._all_markers
                ):
                    found = None  # a longer marker may still arrive: hold from i
                    end = i
                elif marker in self.drop_markers and marker not in self.start_markers:
                    self._put(out, buf[pos:i])
                    pos = i + len(marker)
                    continue
                else:
                    text = buf[pos:i]
                    kept = text.rstrip(_WS) if self.trim_whitespace else text
                    self._put(out, kept)
                    blk = Block(0, marker)
                    blk.pre_ws = text[len(kept) :]
                    self._buf = buf[i:]
                    self._pos = 0
                    self._block = blk
                    return
            else:
                end = len(buf) if final else self.hold_from(buf, pos)
                if final and self.cut_prefixes:
                    cut = self.hold_from(buf, pos)  # a marker cut by the end of the stream
                    if buf.startswith(self.cut_prefixes, cut):
                        end = cut
                        self._buf = buf = buf[:cut]
            text = buf[pos:end]
            if self.trim_whitespace and not final:
                text = text.rstrip(_WS)
            self._put(out, text)
            pos += len(text)
            self._buf = buf[pos:]
            self._pos = 0
            return

    def _surface(self, blk: Block, deltas: list[ToolCallDelta]) -> None:
        for c in blk.calls:
            if c.rejected:
                continue
            if c.index is None:
                if c.name is None:
                    continue
                if c.name not in self.tool_names:
                    c.rejected = True
                    continue
                c.index = self._next_index
                self._next_index += 1
                c.sent = len(c.arguments)
                deltas.append(ToolCallDelta(c.index, c.name, c.arguments))
            elif len(c.arguments) > c.sent:
                deltas.append(ToolCallDelta(c.index, None, c.arguments[c.sent :]))
                c.sent = len(c.arguments)

    def _rejected_text(self, blk: Block, upto: int) -> str:
        parts = []
        for c in blk.calls:
            if c.rejected and c.start is not None and c.end is not None and c.end <= upto:
                parts.append(self._buf[c.start : c.end])
        return "".join(parts)

    def _complete(self, c: CallState) -> None:
        if c.index is not None and c.done and c.name is not None:
            self._completed[c.index] = ToolCall(name=c.name, arguments=c.arguments)

    def _close(self, blk: Block, out: list[str]) -> None:
        assert blk.end is not None
        end = max(blk.end, blk.start + len(blk.marker))  # always make progress
        surfaced = [c for c in blk.calls if c.index is not None]
        for c in surfaced:
            self._complete(c)
        if not surfaced:  # no call (framing only, or unknown names): the block is content
            raw = self._buf[blk.start : end] if blk.replace is None else blk.replace
            self._put(out, blk.pre_ws + raw)
        else:
            self._owe(blk.pre_ws)
            if any(c.rejected for c in blk.calls):
                spans = all(c.start is not None and c.end is not None
                            for c in blk.calls if c.rejected)
                self._put(out, self._rejected_text(blk, end) if spans
                          else self._buf[blk.start : end])
        self._after_block = bool(surfaced)
        self._leave(blk, end)

    def _abandon(self, blk: Block, out: list[str]) -> None:
        done = [c for c in blk.calls if c.index is not None and c.done and c.end is not None]
        for c in done:
            self._complete(c)
        if done:
            cut = max(c.end for c in done if c.end is not None)
            self._owe(blk.pre_ws)
            self._put(out, self._rejected_text(blk, cut))
            self._after_block = True
        elif blk.end is not None and blk.replace is not None:
            cut = blk.end  # the malformed block stands for the text the format gave
            self._put(out, blk.pre_ws + blk.replace)
        elif blk.end is not None and not any(c.index is not None for c in blk.calls):
            cut = blk.end
            self._put(out, blk.pre_ws + self._unframed(self._buf[blk.start : cut]))
        else:
            cut = blk.start + len(blk.marker)
            self._put(out, blk.pre_ws + ("" if self.framing_tokens else blk.marker))
        self._leave(blk, cut)

    def _unframed(self, raw: str) -> str:
        """A rejected block's text as content: with ``framing_tokens``, without its markers."""
        if not self.framing_tokens:
            return raw
        for m in sorted(self._all_markers, key=len, reverse=True):
            raw = raw.replace(m, "")
        return raw.strip(_WS)

    def _leave(self, blk: Block, pos: int) -> None:
        self._block = None
        self._buf = self._buf[pos:]
        self._pos = 0


class TaggedBlockParser(StreamingToolParser):
    """Blocks ``<start> body <end>`` parsed whole when the end marker arrives (atomic calls).

    Subclasses set ``start_markers`` and ``end_marker`` and implement :meth:`parse_body`. Several
    calls from one body are all surfaced; an unknown name among them makes the whole block text
    content as well (give single-call blocks, or override ``advance`` for spans).
    """

    end_marker: str = ""

    @abstractmethod
    def parse_body(self, body: str) -> list[tuple[str, Any]] | None:
        """``[(name, arguments_object), ...]`` of a complete body, or None when malformed."""

    def advance(self, text: str, block: Block, final: bool) -> None:
        body_at = block.start + len(block.marker)
        end = text.find(self.end_marker, block.scan)
        if end < 0:
            block.scan = max(body_at, len(text) - len(self.end_marker) + 1)
            return
        calls = self.parse_body(text[body_at:end])
        block.end = end + len(self.end_marker)
        if not calls:
            block.invalid = True
            return
        for name, args in calls:
            if not isinstance(name, str) or not isinstance(args, dict):
                block.invalid = True
                block.calls.clear()
                return
            block.calls.append(CallState(name=name, arguments=self.dump(args), done=True))


class PassThroughToolParser(ToolParser):
    """No format: every text is content, no calls (``auto`` when no format is detected)."""

    def parse(self, text: str) -> ToolResult:
        return ToolResult(content=text)

    def feed(self, chunk: str) -> ToolDelta:
        return ToolDelta(content=chunk)

    def finish(self) -> ToolDelta:
        return ToolDelta()

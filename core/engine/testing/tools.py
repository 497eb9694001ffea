"""Conformance kit for tool-call parser plugins: checks that hold for every format.

``check(name, factory, samples=())`` returns failure messages (empty: pass). ``factory`` is what
the plugin's ``engine_create_tool_parser`` returned (``factory(*, tools) -> ToolParser``). The
generic checks need no knowledge of the format:

* the factory builds a :class:`~engine.parsers.base.ToolParser`;
* ``parse``/``feed``/``finish`` never raise and return the declared types, on plain, unicode,
  garbage and "marker soup" text (fragments of many formats' markers and JSON);
* plain prose (no brackets, tags or JSON) comes back unchanged as content with no calls, whole
  and streamed (a split at every position, one-character chunks, random 1-8 character chunks);
* streamed deltas are well formed: the first delta of each index carries a name, later ones
  none; indices are contiguous from 0; fragments are strings; streamed calls name declared tools;
* streaming equals the whole parse (content and calls) on marker soup that names no declared
  tool, and no call surfaces there;
* calls of a whole parse name declared tools and carry JSON-object arguments text, valid JSON
  in the strict sense (no ``NaN``/``Infinity``, which JSON clients refuse), streamed calls too;
* a parser that gives a call constraint (``call_constraint``, for a forced ``tool_choice``)
  parses the text of each of its structures, filled with valid arguments, as that call (and
  two in a row when the constraint is parallel), and a named choice allows that tool alone.

``samples`` (optional): texts in the plugin's own format; a parser may also list some in a
``conformance_samples`` attribute, and the texts of its call constraint count too. For each,
streaming at every split and in random chunks must equal the whole parse (concatenated
fragments equal ``arguments``), and with no declared tools, or only other tools, no call may
surface. For each sample that yields calls:

* no marker text of the format (its ``start_markers``/``drop_markers`` of two or more
  characters) is left in the content;
* no text is lost or glued: with words before and after it (``"Alpha " + sample + " Omega"``,
  and with only a newline before and nothing after), the same calls come back and the content
  holds ``Alpha``, the sample's own content words and ``Omega``, each a word of its own;
  streamed alike. (A format whose block runs to the end of the response, so that the words
  after it change the calls, is exempt from that part.)

A parser whose call constraint gives a text is also fed that text with a number beyond float
range (``1e999``) as a value: its arguments must still be strict JSON.

A parser with a documented asymmetry may provide ``stream_matches(whole: ToolResult, streamed:
ToolResult) -> bool``.
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable, Iterable

from engine.parsers.base import ToolCall, ToolDelta, ToolParser, ToolResult

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
OTHER_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "unrelated_tool", "parameters": {}}}
]

#: prose without brackets, tags or JSON: must come back unchanged
PLAIN = (
    "The answer is 42. Nothing special here, just words and digits 1 2 3.",
    "First line\nsecond line\n\nthird line with tabs\tand  spaces ",
    "Unicode: héllo wörld, 你好, 😀 emoji, Ωμέγα and ▁ blocks.",
    "  leading and trailing whitespace  \n",
)

#: marker-like fragments of many formats (no declared tool name among them)
FRAGMENTS = (
    "<tool_call>", "</tool_call>", "<tool_call>\n", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]",
    "[TOOL_CALLS", "<|tool_call_start|>", "<|tool_call_end|>", "<|tools_prefix|>",
    "<|tools_suffix|>", "<|START_ACTION|>", "<|END_ACTION|>", "<|action_start|> <|plugin|>",
    "<|action_end|>", "function call<|role_sep|>", "<|function_call|>", "<|message_sep|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>", "function", "```json\n", "```", "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "functions.nope:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<|tool_calls_section_end|>", "<|open|>tools<|sep|>", '<|open|>call tool="nope"<|sep|>',
    "<|close|>call<|sep|>", "<|close|>tools<|sep|>", "<|open|>response<|sep|>", "<|start|>",
    "<|channel|>", "commentary to=functions.nope", "final", "<|message|>", "<|call|>", "<|end|>",
    "<|tool_call>", "call:nope{", "<tool_call|>", '<|"|>', "<|message_model|>",
    "<|content_invoke_tool_json|>", "<|end_message|>", "<think>", "</think>", "<function=nope>",
    "<parameter=x>", "</parameter>", "</function>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", '<invoke name="nope">', '<parameter name="x">', "</invoke>",
    "<｜DSML｜function_calls>", "<｜DSML｜tool_calls>", '<｜DSML｜invoke name="nope">',
    "<minimax:tool_call>", "]<]minimax[>[", "<function_calls>", '{"name": "nope", "arguments": {',
    '{"name": "nope", "parameters": {"a": 1}}', '"x": "y"', "}", "{", "[", "]", "(", ")", ";", ",",
    "nope(a=1)", "[nope(a=1)]", '{"nope": {}}', '"tool_name": "nope"', "\\", '"', "'", "\n",
    " ", "<", ">", "|", "｜", "▁", "😀", "é", "\u2028", "\x00",
)

Factory = Callable[..., ToolParser]


def _stream(parser: ToolParser, chunks: Iterable[str]) -> list[ToolDelta]:
    out = [parser.feed(c) for c in chunks]
    out.append(parser.finish())
    return out


def _assemble(deltas: list[ToolDelta]) -> tuple[ToolResult, list[str]]:
    """Fold deltas into a result; also return well-formedness problems."""
    problems: list[str] = []
    content: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    for d in deltas:
        if not isinstance(d, ToolDelta) or not isinstance(d.content, str):
            problems.append(f"feed/finish returned {d!r}, not a ToolDelta with str content")
            continue
        content.append(d.content)
        for c in d.calls:
            if not isinstance(c.arguments, str):
                problems.append(f"call {c.index}: arguments fragment {c.arguments!r} is not str")
                continue
            if c.index not in names:
                if c.name is None:
                    problems.append(f"call {c.index}: first delta carries no name")
                    continue
                if c.index != len(names):
                    problems.append(f"call index {c.index} is not the next index {len(names)}")
                names[c.index] = c.name
                args[c.index] = [c.arguments]
            else:
                if c.name is not None:
                    problems.append(f"call {c.index}: a later delta repeats the name")
                args[c.index].append(c.arguments)
    calls = [ToolCall(names[i], "".join(args[i])) for i in sorted(names)]
    return ToolResult(content="".join(content), calls=calls), problems


def _show(r: ToolResult) -> str:
    return repr((r.content, [(c.name, c.arguments) for c in r.calls]))


def _same(parser: ToolParser, whole: ToolResult, streamed: ToolResult) -> bool:
    hook = getattr(parser, "stream_matches", None)
    if callable(hook):
        return bool(hook(whole, streamed))
    return whole.content == streamed.content and [(c.name, c.arguments) for c in whole.calls] == [
        (c.name, c.arguments) for c in streamed.calls
    ]


def _splits(text: str, rng: random.Random, every: bool) -> Iterable[list[str]]:
    if every:
        for i in range(len(text) + 1):
            yield [text[:i], text[i:]]
        yield list(text)
    for _ in range(6):
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            chunks.append(text[i : i + n])
            i += n
        yield chunks


class _Checker:
    def __init__(self, name: str, factory: Factory) -> None:
        self.name = name
        self.factory = factory
        self.failures: list[str] = []

    def fail(self, msg: str) -> None:
        if len(self.failures) < 30:
            self.failures.append(f"{self.name}: {msg}")

    def build(self, tools: list[dict[str, Any]]) -> ToolParser | None:
        try:
            p = self.factory(tools=tools)
        except Exception as exc:  # noqa: BLE001 - reported as a failure
            self.fail(f"factory(tools=...) raised {exc!r}")
            return None
        if not isinstance(p, ToolParser):
            self.fail(f"factory returned {type(p).__name__}, not a ToolParser")
            return None
        return p

    def whole(self, text: str, tools: list[dict[str, Any]]) -> ToolResult | None:
        p = self.build(tools)
        if p is None:
            return None
        try:
            r = p.parse(text)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"parse raised {exc!r} on {text[:80]!r}")
            return None
        if not isinstance(r, ToolResult) or not isinstance(r.content, str):
            self.fail(f"parse returned {r!r}, not a ToolResult")
            return None
        names = {t["function"]["name"] for t in tools}
        for c in r.calls:
            if c.name not in names:
                self.fail(f"parse surfaced undeclared tool {c.name!r} on {text[:80]!r}")
            self.json_object(c)
        return r

    def json_object(self, c: ToolCall) -> None:
        if not strict_json_object(c.arguments):
            self.fail(f"call {c.name!r}: arguments {c.arguments!r} are not a (strict) JSON "
                      "object")

    def streamed(
        self, chunks: list[str], tools: list[dict[str, Any]]
    ) -> tuple[ToolParser, ToolResult] | None:
        p = self.build(tools)
        if p is None:
            return None
        try:
            deltas = _stream(p, chunks)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"streaming raised {exc!r} on {''.join(chunks)[:80]!r}")
            return None
        r, problems = _assemble(deltas)
        for msg in problems:
            self.fail(f"{msg} (text {''.join(chunks)[:80]!r})")
        names = {t["function"]["name"] for t in tools}
        for c in r.calls:
            if c.name not in names:
                self.fail(f"streaming surfaced undeclared tool {c.name!r}")
            elif _same(p, ToolResult(calls=[c]), ToolResult(calls=[c])):
                self.json_object(c)
        return p, r

    def equivalence(self, text: str, tools: list[dict[str, Any]], rng: random.Random,
                    every: bool) -> ToolResult | None:
        """Stream ``text`` in many ways and compare with the whole parse, which is returned."""
        whole = self.whole(text, tools)
        if whole is None:
            return None
        for chunks in _splits(text, rng, every):
            got = self.streamed(chunks, tools)
            if got is None:
                break
            p, r = got
            if not _same(p, whole, r):
                self.fail(f"streamed {_show(r)} != whole {_show(whole)} for chunks {chunks[:12]!r}")
                break
        return whole


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def strict_json_object(text: Any) -> bool:
    """Whether ``text`` is a JSON object text that strict JSON parsers accept (Python's
    ``json`` alone also takes ``NaN``, ``Infinity`` and ``1e999``, which decodes to infinity)."""
    def finite_float(word: str) -> float:
        value = float(word)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"{word} is beyond float range")
        return value

    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=finite_float)
    except (TypeError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict)


def _markers(parser: ToolParser) -> list[str]:
    found = []
    for attr in ("start_markers", "drop_markers"):
        for m in getattr(parser, attr, ()) or ():
            if isinstance(m, str) and len(m.strip()) >= 2:
                found.append(m)
    return found


def _calls(r: ToolResult) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in r.calls]


def _check_surroundings(ck: "_Checker", text: str, whole: ToolResult,
                        rng: random.Random) -> None:
    """A sample that yields calls: no marker in content; words around it neither lost nor
    glued, whole and streamed."""
    p = ck.build(TOOLS)
    if p is None:
        return
    markers = _markers(p)
    for m in markers:
        if m in whole.content:
            ck.fail(f"marker {m!r} left in content {whole.content!r} of {text[:80]!r}")
    words = whole.content.split()
    for wrapped in ("Alpha " + text + " Omega", "Alpha\n" + text):
        got = ck.equivalence(wrapped, TOOLS, rng, every=False)
        if got is None or _calls(got) != _calls(whole):
            continue  # the words after the block changed it (a block that runs to the end)
        want = ["Alpha", *words] + (["Omega"] if wrapped.endswith("Omega") else [])
        if got.content.split() != want:
            ck.fail(f"text around calls lost or glued: {wrapped[:100]!r} gave content "
                    f"{got.content!r}")
        for m in markers:
            if m in got.content:
                ck.fail(f"marker {m!r} left in content {got.content!r}")


def _soup(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(3, 25))) for _ in range(n)]


def check(name: str, factory: Factory, samples: Iterable[str] = ()) -> list[str]:
    """Run the generic tool-parser checks on ``factory``; return failure messages."""
    ck = _Checker(name, factory)
    rng = random.Random(1234)
    if ck.build(TOOLS) is None:
        return ck.failures
    # plain prose: unchanged, no calls, for every split
    for text in PLAIN:
        whole = ck.equivalence(text, TOOLS, rng, every=True)
        if whole is not None and (whole.content != text or whole.calls):
            ck.fail(f"plain text {text!r} came back as {_show(whole)}")
    # empty input and empty chunks
    got = ck.streamed(["", "", ""], TOOLS)
    if got is not None and (got[1].content or got[1].calls):
        ck.fail(f"empty chunks produced {_show(got[1])}")
    # garbage and marker soup naming no declared tool: no raise, no calls, stream == whole
    garbage = ["".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 60)))
               for _ in range(6)]
    for i, text in enumerate(garbage + _soup(rng, 40)):
        whole = ck.equivalence(text, TOOLS, rng, every=i < 4)
        if whole is not None and whole.calls:
            ck.fail(f"calls surfaced from text naming no declared tool: {_show(whole)}")
    # the plugin's own format
    probe = ck.build(TOOLS)
    own = list(getattr(probe, "conformance_samples", ()) or ())
    texts = list(samples) + own + _constraint_texts(probe)
    for text in texts:
        whole = ck.equivalence(text, TOOLS, rng, every=True)
        if whole is not None and whole.calls:
            _check_surroundings(ck, text, whole, rng)
        for tools in ([], OTHER_TOOLS):
            whole = ck.whole(text, tools)
            if whole is not None and whole.calls:
                ck.fail(f"undeclared tools surfaced as calls: {_show(whole)}")
            got = ck.streamed([text[i : i + 3] for i in range(0, len(text), 3)], tools)
            if got is not None and got[1].calls:
                ck.fail(f"undeclared tools surfaced while streaming: {_show(got[1])}")
    _check_call_constraint(ck)
    return ck.failures


#: arguments valid for each tool of :data:`TOOLS`
EXAMPLE_ARGS = {"get_weather": {"city": "Paris", "days": 2}, "get_time": {"tz": "UTC"}}


def _constraint_texts(p: ToolParser | None) -> list[str]:
    """The text of each structure of the parser's call constraint (valid arguments), and one
    whose number is beyond float range (``1e999``)."""
    try:
        spec = p.call_constraint("", True) if p is not None else None
        tag = json.loads(spec.text) if spec is not None else None
        out = []
        for st in tag["structures"] if tag else ():
            name = _const_name(st)
            value = {k: v.get("const", EXAMPLE_ARGS[name])
                     for k, v in st["schema"]["properties"].items()}
            out.append(st["begin"] + json.dumps(value) + st["end"])
            if name == "get_weather":
                out.append(out[-1].replace('"days": 2', '"days": 1e999'))
        return out
    except Exception:  # noqa: BLE001 - a broken constraint is reported by its own check
        return []


def _check_call_constraint(ck: _Checker) -> None:
    """When the parser gives a ``tool_calls`` constraint, each structure filled with valid
    arguments (the name the ``const`` of its schema, or its ``begin`` for keyword arguments)
    parses as exactly that call, one and two in a row (parallel), within the constraint's
    prefix, separator and suffix."""
    p = ck.build(TOOLS)
    spec = p.call_constraint("", True) if p is not None else None
    if spec is None:
        return
    tag = json.loads(spec.text)
    texts, expected = [], []
    for st in tag["structures"]:
        name = _structure_name(st)
        if st.get("arguments", "json") == "kwargs":
            args = ", ".join(f"{k}={json.dumps(v)}" for k, v in EXAMPLE_ARGS[name].items())
            texts.append(st["begin"] + args + st["end"])
        else:
            value = {k: v.get("const", EXAMPLE_ARGS[name])
                     for k, v in st["schema"]["properties"].items()}
            texts.append(st["begin"] + json.dumps(value) + st["end"])
        expected.append((name, EXAMPLE_ARGS[name]))
    prefix, suffix = tag.get("prefix", ""), tag.get("suffix", "")
    cases = [(prefix + t + suffix, [e]) for t, e in zip(texts, expected)]
    if tag["parallel"]:
        cases.append((prefix + tag.get("separator", "\n").join(texts) + suffix, expected))
    for text, want in cases:
        got = ck.whole(text, TOOLS)
        calls = [(c.name, json.loads(c.arguments)) for c in got.calls] if got else None
        if calls != want:
            ck.fail(f"text of its own call constraint {text!r} parsed as {calls}")
    named = json.loads(p.call_constraint("get_time", False).text)["structures"]
    if [_structure_name(st) for st in named] != ["get_time"]:
        ck.fail("the constraint of a named tool_choice allows other tools")


def _structure_name(structure: dict[str, Any]) -> str:
    """The tool name a ``tool_calls`` structure fixes: the ``const`` in its call schema, or, for
    keyword arguments, its ``begin`` up to ``(``."""
    if structure.get("arguments", "json") == "kwargs":
        return structure["begin"].rstrip("(")
    return _const_name(structure)


def _const_name(structure: dict[str, Any]) -> str:
    """The tool name a ``tool_calls`` structure fixes (the ``const`` in its schema)."""
    return next(v["const"] for v in structure["schema"]["properties"].values() if "const" in v)

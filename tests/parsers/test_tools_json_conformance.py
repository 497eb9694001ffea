"""The tool-parser conformance kit over every installed plugin, and the kit's own teeth."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from engine.parsers.base import ToolCallDelta, ToolDelta, ToolResult
from engine.parsers.toolkit import PassThroughToolParser
from engine.assembly import parser_factory
from engine.testing.tools import check

from json_tool_cases import FACT_SHEET, ONE, RICH, TWO, WIRE, plugin_of
from xml_tool_cases import FORMATS as XML_FORMATS, ONE as XML_ONE, TWO as XML_TWO

INSTALLED = sorted(ep.name for ep in entry_points(group="engine.tool_parser"))

#: one call per response: a second call stays content, markers and all (see its README)
SINGLE_CALL = {"gigachat3"}

SAMPLES: dict[str, list[str]] = {}
for _key, _wire in WIRE.items():
    _name = plugin_of(_key)
    SAMPLES.setdefault(_name, []).extend(
        [_wire(ONE), _wire(RICH), "Let me check.\n" + _wire(ONE)]
        + ([] if _name in SINGLE_CALL else [_wire(TWO)])
    )
for _name, (_enc, _malformed) in XML_FORMATS.items():
    SAMPLES.setdefault(_name, []).extend([_enc(XML_ONE), _enc(XML_TWO)])
for _name, _text, _content, _calls in FACT_SHEET:
    SAMPLES.setdefault(_name, []).append(_text)


@pytest.mark.parametrize("name", INSTALLED)
def test_conformance(name):
    factory = parser_factory("tool_parser", name, chat_template=None)
    samples = SAMPLES.get(name, [])[:6]
    assert check(name, factory, samples=samples) == []


# --------------------------------------------------------------------------- the kit detects


class _Loses(PassThroughToolParser):
    def parse(self, text):
        return ToolResult(content=text[:-1])


class _Unknown(PassThroughToolParser):
    def parse(self, text):
        return ToolResult(content="", calls=[type("C", (), {"name": "nope", "arguments": "{}"})()])


class _Chunky(PassThroughToolParser):
    def feed(self, chunk):
        return ToolDelta(content=chunk.strip())


class _Raises(PassThroughToolParser):
    def parse(self, text):
        if "<" in text:
            raise ValueError("boom")
        return ToolResult(content=text)


class _NoName(PassThroughToolParser):
    def finish(self):
        return ToolDelta(calls=[ToolCallDelta(index=0, name=None, arguments="{}")])


class _NotAParser:
    def __init__(self, *, tools):
        pass


@pytest.mark.parametrize(
    "cls,needle",
    [
        (_Loses, "came back as"),
        (_Unknown, "undeclared"),
        (_Chunky, "streamed"),
        (_Raises, "raised"),
        (_NoName, "no name"),
        (_NotAParser, "not a ToolParser"),
    ],
)
def test_kit_reports_broken_parsers(cls, needle):
    failures = check("broken", lambda *, tools: cls(tools=tools))
    assert failures and any(needle in f for f in failures), failures


def test_kit_passes_pass_through():
    assert check("pass", lambda *, tools: PassThroughToolParser(tools=tools)) == []


def test_kit_sample_with_undeclared_tools_is_caught():
    class Eager(PassThroughToolParser):
        """Surfaces a call whenever the text mentions get_weather, declared or not."""

        def parse(self, text):
            calls = [type("C", (), {"name": "get_weather", "arguments": "{}"})()] if "get_weather" in text else []
            return ToolResult(content="" if calls else text, calls=calls)

    failures = check("eager", lambda *, tools: Eager(tools=tools), samples=["call get_weather now"])
    assert any("undeclared" in f for f in failures)


# --------------------------------------------------------------------------- the generic
# properties a parser must keep: strict JSON arguments, no marker in content, no text lost or
# glued around a call (streaming = whole is checked everywhere above)

from engine.parsers.json_tools import JsonTagParser  # noqa: E402


class _Tagged(JsonTagParser):
    start_markers = ("<call>",)
    end_marker = "</call>"


class _Glues(_Tagged):
    join_with_whitespace = False


class _LeavesMarker(_Tagged):
    drop_markers = ("<|sep|>",)

    def _put(self, out, text):  # emits the dropped separator after all
        super()._put(out, text.replace("before", "before<|sep|>"))


class _Infinite(_Tagged):
    def advance(self, text, block, final):
        super().advance(text, block, final)
        for c in block.calls:
            if c.done:
                c.arguments = '{"city": "x", "days": Infinity}'


SAMPLE = 'before <call>{"name": "get_weather", "arguments": {"city": "x"}}</call>'


@pytest.mark.parametrize("cls,needle", [(_Glues, "lost or glued"), (_LeavesMarker, "marker"),
                                        (_Infinite, "strict")])
def test_kit_reports_broken_behaviours(cls, needle):
    failures = check("broken", lambda *, tools: cls(tools=tools), samples=[SAMPLE])
    assert failures and any(needle in f for f in failures), failures


def test_kit_passes_a_well_behaved_format():
    assert check("tagged", lambda *, tools: _Tagged(tools=tools), samples=[SAMPLE]) == []


def test_kit_feeds_a_number_beyond_float_range_through_the_call_constraint():
    """The constraint's text with ``1e999`` as a value: a parser that lets the infinity through
    fails; the shared JSON machinery keeps the number's text and passes."""
    class Naive(_Tagged):
        def advance(self, text, block, final):
            super().advance(text, block, final)
            for c in block.calls:
                if c.done and "1e999" in text:
                    c.arguments = c.arguments.replace('"1e999"', "Infinity")

    assert any("strict" in f for f in check("naive", lambda *, tools: Naive(tools=tools)))

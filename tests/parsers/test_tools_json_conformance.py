"""The tool-parser conformance kit over every installed plugin, and the kit's own teeth."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from engine.parsers.base import ToolCallDelta, ToolDelta, ToolResult
from engine.parsers.toolkit import PassThroughToolParser
from engine.assembly import parser_factory
from engine.testing.tools import check

from json_tool_cases import FACT_SHEET, ONE, RICH, TWO, WIRE, plugin_of

INSTALLED = sorted(ep.name for ep in entry_points(group="engine.tool_parser"))

SAMPLES: dict[str, list[str]] = {}
for _key, _wire in WIRE.items():
    SAMPLES.setdefault(plugin_of(_key), []).extend(
        [_wire(ONE), _wire(TWO), _wire(RICH), "Let me check.\n" + _wire(ONE)]
    )
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

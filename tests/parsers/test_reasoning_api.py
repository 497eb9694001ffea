"""parse_message / MessageStream / assemble, and ``engine parse`` as a subprocess.

A small tool parser (JSON inside ``<tool_call>`` tags) is defined here so these tests do not
depend on the tool-call plugins.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from typing import Any

import pytest

from engine.parsers.api import MessageStream, assemble, parse_message
from engine.parsers.base import (
    ToolCall,
    ToolCallDelta,
    ToolDelta,
    ToolParser,
    ToolResult,
)
from engine.parsers.reasoning import ParserFactory, partial_tail

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
OPEN, CLOSE = "<tool_call>", "</tool_call>"


class TagJsonTools(ToolParser):
    """``<tool_call>{"name", "arguments"}</tool_call>``; streams each call as a name delta then
    its arguments in two fragments. A block that is not a known call stays content."""

    def __init__(self, *, tools=None) -> None:
        super().__init__(tools=tools)
        self._buf = ""
        self._n = 0

    def parse(self, text: str) -> ToolResult:
        result = ToolResult()
        for d in (self.feed(text), self.finish()):
            result.content += d.content
            for piece in d.calls:
                if piece.name is not None:
                    result.calls.append(ToolCall(piece.name, ""))
                result.calls[piece.index].arguments += piece.arguments
        return result

    def feed(self, chunk: str) -> ToolDelta:
        self._buf += chunk
        return self._drain(False)

    def finish(self) -> ToolDelta:
        return self._drain(True)

    def _call(self, block: str) -> ToolCall | None:
        try:
            obj = json.loads(block)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.tool_names:
            return None
        return ToolCall(obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False))

    def _drain(self, final: bool) -> ToolDelta:
        delta = ToolDelta()
        while True:
            i = self._buf.find(OPEN)
            if i == -1:
                keep = 0 if final else partial_tail(self._buf, (OPEN,))
                delta.content += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep:]
                return delta
            delta.content += self._buf[:i]
            self._buf = self._buf[i:]
            j = self._buf.find(CLOSE)
            if j == -1:
                if final:
                    delta.content += self._buf
                    self._buf = ""
                return delta
            block, self._buf = self._buf[: j + len(CLOSE)], self._buf[j + len(CLOSE):]
            call = self._call(block[len(OPEN): -len(CLOSE)])
            if call is None:
                delta.content += block
                continue
            half = len(call.arguments) // 2
            delta.calls += [ToolCallDelta(self._n, call.name, ""),
                            ToolCallDelta(self._n, None, call.arguments[:half]),
                            ToolCallDelta(self._n, None, call.arguments[half:])]
            self._n += 1


def tool_factory(*, tools):
    return TagJsonTools(tools=tools)


def call(name: str, args: dict[str, Any]) -> str:
    return OPEN + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + CLOSE


ID = re.compile(r"call_[0-9a-f]{24}")

MESSAGES = [
    # (text, kwargs, expected message without ids)
    ("<think>plan</think>Hi", dict(reasoning_parser="deepseek-r1"),
     {"reasoning_content": "plan", "content": "Hi", "tool_calls": []}),
    ("Hi", {}, {"reasoning_content": None, "content": "Hi", "tool_calls": []}),
    ("plan</think>", dict(reasoning_parser="deepseek-r1"),
     {"reasoning_content": "plan", "content": None, "tool_calls": []}),
    ("<think>Need weather</think>Sure." + call("get_weather", {"city": "Paris"}),
     dict(reasoning_parser="qwen3", tool_parser=tool_factory, tools=TOOLS),
     {"reasoning_content": "Need weather", "content": "Sure.",
      "tool_calls": [("get_weather", '{"city": "Paris"}')]}),
    # implicit close of reasoning by the tool-start marker; two calls, unicode and nesting
    ("<think>Need weather\n" + call("get_weather", {"city": "Zürich", "opts": {"u": ["C"]}})
     + call("get_time", {"tz": "Europe/Zürich \"q\""}),
     dict(reasoning_parser="qwen3", tool_parser=tool_factory, tools=TOOLS),
     {"reasoning_content": "Need weather\n", "content": None,
      "tool_calls": [("get_weather", '{"city": "Zürich", "opts": {"u": ["C"]}}'),
                     ("get_time", '{"tz": "Europe/Zürich \\"q\\""}')]}),
    # a call marker inside unclosed reasoning closes it (as SGLang's tool_start_token): the
    # call is read from the content that follows, and a late </think> is plain content
    ("<think>maybe " + call("get_time", {}) + " no</think>ok",
     dict(reasoning_parser="qwen3", tool_parser=tool_factory, tools=TOOLS),
     {"reasoning_content": "maybe ", "content": " no</think>ok",
      "tool_calls": [("get_time", "{}")]}),
    # unknown tool and no tools: text stays content
    ("x" + call("rm_rf", {}), dict(tool_parser=tool_factory, tools=TOOLS),
     {"reasoning_content": None, "content": "x" + call("rm_rf", {}), "tool_calls": []}),
    ("x" + call("get_time", {}), dict(tool_parser=tool_factory),
     {"reasoning_content": None, "content": "x" + call("get_time", {}), "tool_calls": []}),
    # separate_reasoning=False keeps the reasoning text in content, ahead of the answer
    ("<think>plan</think>Hi" + call("get_time", {"tz": "UTC"}),
     dict(reasoning_parser="qwen3", tool_parser=tool_factory, tools=TOOLS,
          separate_reasoning=False),
     {"reasoning_content": None, "content": "planHi",
      "tool_calls": [("get_time", '{"tz": "UTC"}')]}),
    # request toggles reach the reasoning parser
    ("plain", dict(reasoning_parser="qwen3", chat_template_kwargs={"enable_thinking": False}),
     {"reasoning_content": None, "content": "plain", "tool_calls": []}),
    ("p[/THINK]a", dict(reasoning_parser="mistral", reasoning_effort="high"),
     {"reasoning_content": "p", "content": "a", "tool_calls": []}),
    # a factory object instead of a name
    ("p</think>a", dict(reasoning_parser=ParserFactory("t", policy="always",
                                                        template_overrides=False)),
     {"reasoning_content": "p", "content": "a", "tool_calls": []}),
    # a chat template for auto
    ("p</think>a", dict(reasoning_parser="auto",
                        chat_template="{{- '<|im_start|>assistant\\n<think>\\n' }}"),
     {"reasoning_content": "p", "content": "a", "tool_calls": []}),
    # Harmony: the tool framing passes through reasoning into the tool parser's input
    ("<|channel|>analysis<|message|>Need tool.<|end|><|start|>assistant<|channel|>final"
     "<|message|>On it." + call("get_time", {"tz": "CET"}) + "<|return|>",
     dict(reasoning_parser="gpt-oss", tool_parser=tool_factory, tools=TOOLS),
     {"reasoning_content": "Need tool.", "content": "On it.",
      "tool_calls": [("get_time", '{"tz": "CET"}')]}),
]


def strip_ids(msg: dict[str, Any]) -> dict[str, Any]:
    for c in msg["tool_calls"]:
        assert ID.fullmatch(c["id"]) and c["type"] == "function"
    return {**msg, "tool_calls": [(c["function"]["name"], c["function"]["arguments"])
                                  for c in msg["tool_calls"]]}


@pytest.mark.parametrize("text,kwargs,expected", MESSAGES)
def test_parse_message(text, kwargs, expected):
    assert strip_ids(parse_message(text, **kwargs)) == expected


def _chunkings(text: str):
    rng = random.Random(3)
    yield [text]
    yield list(text)
    yield from ([text[:i], text[i:]] for i in range(0, len(text), 3))
    for _ in range(4):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            pieces.append(text[i:i + n])
            i += n
        yield pieces


@pytest.mark.parametrize("text,kwargs,expected", MESSAGES)
def test_stream_assembles_to_whole(text, kwargs, expected):
    for chunks in _chunkings(text):
        s = MessageStream(**kwargs)
        deltas = [s.feed(ch) for ch in chunks] + [s.finish()]
        assert strip_ids(assemble(deltas)) == expected, chunks


def test_delta_shapes():
    s = MessageStream(reasoning_parser="qwen3", tool_parser=tool_factory, tools=TOOLS)
    text = "<think>r</think>ok" + call("get_weather", {"city": "Paris"}) + call("get_time", {})
    deltas = [s.feed(ch) for ch in (text[:10], text[10:40], text[40:])] + [s.finish()]
    for d in deltas:
        assert all(d[k] for k in d) and set(d) <= {"reasoning_content", "content", "tool_calls"}
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    first = [tc for tc in calls if "id" in tc]
    assert [tc["index"] for tc in first] == [0, 1]
    for tc in first:
        assert ID.fullmatch(tc["id"]) and tc["type"] == "function"
        assert set(tc["function"]) == {"name", "arguments"}
    for tc in calls:
        if "id" not in tc:
            assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
    assert s.finish() == {}
    with pytest.raises(RuntimeError):
        s.feed("x")


def test_deltas_split_one_call_across_chunks():
    s = MessageStream(tool_parser=tool_factory, tools=TOOLS)
    text = call("get_weather", {"city": "Paris"})
    deltas = [s.feed(ch) for ch in text] + [s.finish()]
    pieces = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"]["arguments"] for tc in pieces) == '{"city": "Paris"}'


def test_unknown_parser_name_is_a_plugin_error():
    from engine.plugins.registry import PluginError

    with pytest.raises(PluginError):
        parse_message("x", reasoning_parser="no-such-parser")


def test_assemble_empty():
    assert assemble([]) == {"reasoning_content": None, "content": None, "tool_calls": []}


def test_reasoning_delta_placement_without_separation():
    s = MessageStream(reasoning_parser="deepseek-r1", separate_reasoning=False)
    assert s.feed("ab") == {"content": "ab"}
    assert s.feed("</think>c") == {"content": "c"}


# --------------------------------------------------------------------------- engine parse

CLI = [sys.executable, "-m", "engine.cli.parse_cmd"]


@pytest.mark.parametrize("extra", [[], ["--stream", "--chunk-size", "3"]])
def test_cli(extra):
    out = subprocess.run(
        CLI + ["--reasoning-parser", "qwen3", "--chat-template-kwargs", '{"enable_thinking": true}',
               *extra],
        input="<think>Need 2+2.</think>\n\nThe answer is 4.", capture_output=True, text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {"reasoning_content": "Need 2+2.",
                                      "content": "\n\nThe answer is 4.", "tool_calls": []}


@pytest.mark.parametrize("flag,value", [("--chat-template-kwargs", "{oops"), ("--tools", None)])
def test_cli_bad_json(tmp_path, flag, value):
    if value is None:
        bad = tmp_path / "tools.json"
        bad.write_text("[{not json")
        value = str(bad)
    out = subprocess.run(CLI + [flag, value], input="x", capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0]


def test_cli_in_process(monkeypatch, capsys, tmp_path):
    import io

    from engine.cli import parse_cmd

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([t["function"] for t in TOOLS]))
    monkeypatch.setattr(sys, "stdin", io.StringIO("r</think>a"))
    assert parse_cmd.main(["--reasoning-parser", "deepseek-r1", "--tools", str(tools)]) == 0
    assert json.loads(capsys.readouterr().out)["reasoning_content"] == "r"
    monkeypatch.setattr(sys, "stdin", io.StringIO("x"))
    assert parse_cmd.main(["--reasoning-parser", "nope"]) == 2
    assert "nope" in capsys.readouterr().err

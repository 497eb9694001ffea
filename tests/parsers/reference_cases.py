"""The checks the reference-behaviour tests share: a text parsed whole and streamed one
character at a time must agree, and every call's arguments must be strict JSON."""

from __future__ import annotations

import json
from typing import Any

from engine.parsers.api import MessageStream, assemble, parse_message
from engine.testing.tools import strict_json_object


def both(text: str, **kw: Any) -> dict[str, Any]:
    """The whole parse, after checking that a one-character stream assembles to it."""
    whole = parse_message(text, **kw)
    stream = MessageStream(**kw)
    streamed = assemble([*(stream.feed(ch) for ch in text), stream.finish()])
    strip = lambda m: {**m, "tool_calls": [(c["function"]["name"], c["function"]["arguments"])
                                           for c in m["tool_calls"]]}
    assert strip(streamed) == strip(whole)
    for c in whole["tool_calls"]:
        assert strict_json_object(c["function"]["arguments"]), c
    return strip(whole)


def calls(msg: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(n, json.loads(a)) for n, a in msg["tool_calls"]]

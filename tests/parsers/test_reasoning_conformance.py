"""The reasoning conformance kit over every installed reasoning-parser plugin."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from engine.assembly import parser_factory
from engine.testing.reasoning import check

NAMES = sorted({ep.name for ep in entry_points(group="engine.reasoning_parser")})
TEMPLATES = {
    "auto": "{%- if enable_thinking is defined and enable_thinking is false %}<think>{% endif %}",
}


@pytest.mark.parametrize("name", NAMES)
def test_conformance(name):
    factory = parser_factory("reasoning_parser", name, chat_template=TEMPLATES.get(name))
    assert check(name, factory) == []


def test_kit_reports_a_broken_parser():
    from engine.parsers.base import ReasoningDelta, ReasoningParser

    class Forgetful(ReasoningParser):
        """Drops text after '<' in streams (a missing hold-back)."""

        def parse(self, text):
            return ReasoningDelta("", text)

        def feed(self, chunk):
            return ReasoningDelta("", chunk.split("<")[0])

        def finish(self):
            return ReasoningDelta()

    failures = check("forgetful", lambda **_: Forgetful())
    assert failures and "stream" in failures[0]

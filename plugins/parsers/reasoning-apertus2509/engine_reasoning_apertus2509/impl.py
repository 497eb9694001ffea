"""Swiss AI Apertus: ``<|inner_prefix|>`` … ``<|inner_suffix|>`` reasoning blocks.

Never forced: text is content, and each inner block (there may be several, interleaved with
text) is reasoning. A tool block ``<|tools_prefix|>`` … ``<|tools_suffix|>`` inside a reasoning
block is moved, framing included, into content for the tool parser; reasoning resumes after it.
A tool block opens only with ``<|tools_prefix|>[`` (its JSON list): a bare ``<|tools_prefix|>``
not followed by ``[`` is reasoning text, as in the reference. An unclosed reasoning block at the end is reasoning; an unclosed tool block is content.
Partial markers are held back.
"""

from __future__ import annotations

from engine.api.parsers import MarkerStateParser, ParserFactory, take_until
from engine.api import hookimpl

INNER_PREFIX, INNER_SUFFIX = "<|inner_prefix|>", "<|inner_suffix|>"
TOOLS_PREFIX, TOOLS_SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"
TOOLS_START = TOOLS_PREFIX + "["  # a tool block: the prefix token and its JSON list

_TEXT, _THINK, _TOOL = range(3)
_MARKERS = {_TEXT: (INNER_PREFIX,), _THINK: (INNER_SUFFIX, TOOLS_START), _TOOL: (TOOLS_SUFFIX,)}


class Apertus2509ReasoningParser(MarkerStateParser):
    """Splits Apertus output (see the module docstring)."""

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        st = self._state
        m, buf = take_until(buf, _MARKERS[st], final, r if st == _THINK else c)
        if not m:
            return buf, False
        buf = buf[len(m):]
        if m == INNER_PREFIX:
            self._state, self._reasoning_open = _THINK, True
        elif m == INNER_SUFFIX:
            self._state, self._reasoning_open = _TEXT, False
        else:  # a tool block passes into content, framing included
            c.append(m)
            self._state = _TOOL if m == TOOLS_START else _THINK
        return buf, True


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("apertus2509", Apertus2509ReasoningParser, policy=None, options=options)

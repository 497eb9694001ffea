"""GigaChat 3: a single JSON call (wire format and notes in README.md)."""
import re

from engine.api.parsers import JsonTagParser
from engine.api import hookimpl

SEP, HEADER = "<|message_sep|>", "function call<|role_sep|>"
_SEP_CALL = re.compile(re.escape(SEP) + r"\s*" + re.escape(HEADER))
#: what may still grow into whitespace and the header after a separator
_SEP_PARTIAL = re.compile(r"\s*(?:" + "|".join(re.escape(HEADER[:k]) for k in range(len(HEADER), -1, -1)) + r")\Z")


class GigaChat3ToolParser(JsonTagParser):
    start_markers = (
        "<|message_sep|>function call<|role_sep|>",
        "function call<|role_sep|>",
        "<|function_call|>",
    )
    drop_markers = ("</s>",)
    incremental = True
    parallel_calls = False

    def find_start(self, text, pos):
        """Also ``<|message_sep|>`` and whitespace before ``function call<|role_sep|>``: the
        separator belongs to the call, never to the content."""
        found = super().find_start(text, pos)
        m = _SEP_CALL.search(text, pos)
        if m and (found is None or m.start() <= found[0]):
            return m.start(), m.group()
        return found

    def hold_from(self, text, pos):
        i = text.rfind(SEP, pos)
        if i >= 0 and _SEP_PARTIAL.match(text, i + len(SEP)):
            return min(i, super().hold_from(text, pos))
        return super().hold_from(text, pos)

    def advance(self, text, block, final):
        if not block.calls and self._next_index:  # only one call per response
            block.invalid = True
            return
        super().advance(text, block, final)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: GigaChat3ToolParser(tools=tools)

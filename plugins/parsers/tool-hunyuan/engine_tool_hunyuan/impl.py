"""Hunyuan tool calls: <tool_call>NAME<tool_sep> pairs inside <tool_calls>."""
import re
from dataclasses import replace

from engine.api.parsers import ArgPairFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

HUNYUAN_TYPING = ValueTyping(
    typed="schema",
    untyped="raw",
    priority=("boolean", "integer", "number", "object", "array", "null"),
)

FORMAT = ArgPairFormat(
    group=("<tool_calls>", "</tool_calls>"), name_end="sep", sep="<tool_sep>", typing=HUNYUAN_TYPING
)


def _format(chat_template: str | None) -> ArgPairFormat:
    """The markers, suffixed (``<tool_calls:opensource>``) when the template shows a suffix."""
    m = re.search(r"<tool_calls(:[^>\s]+)>", chat_template or "")
    if m is None:
        return FORMAT

    def tag(t: str) -> str:
        suffixed = t[:-1] + m.group(1) + ">"
        return suffixed if suffixed.replace("</", "<") in chat_template else t

    pair = lambda p: (tag(p[0]), tag(p[1]))  # noqa: E731
    return replace(  # HY4 (suffixed tokens) may write no separator after the name
        FORMAT, group=pair(FORMAT.group), call=pair(FORMAT.call), sep=tag(FORMAT.sep),
        key=pair(FORMAT.key), val=pair(FORMAT.val), name_end="sep_or_key",
    )


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=_format(chat_template))

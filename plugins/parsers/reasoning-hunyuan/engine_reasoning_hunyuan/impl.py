"""Hunyuan HY-V3: ``<think>``/``</think>`` or the suffixed forms the chat template uses.

The marker pair is ``<think>``…``</think>``, or ``<think:SUFFIX>``…``</think:SUFFIX>`` when the
template carries a suffixed open marker; the tool-start marker likewise ``<tool_calls>`` or
``<tool_calls:SUFFIX>``. Reasoning is on iff ``reasoning_effort`` is not unset, ``none`` or
``no_think`` (the template then opens reasoning in the prompt).
"""

from __future__ import annotations

import re

from engine.api.parsers import ParserFactory
from engine.api import hookimpl

_THINK = re.compile(r"<think(:[^>\s]+)>")
_TOOLS = re.compile(r"<tool_calls(:[^>\s]+)>")


def markers(chat_template: str | None) -> tuple[str, str, str]:
    """``(start, end, tool_start)`` for a chat template."""
    t = chat_template or ""
    think, tools = _THINK.search(t), _TOOLS.search(t)
    suffix = think.group(1) if think else ""
    tool_suffix = tools.group(1) if tools else ""
    return f"<think{suffix}>", f"</think{suffix}>", f"<tool_calls{tool_suffix}>"


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    start, end, tool = markers(chat_template)
    return ParserFactory("hunyuan", policy="effort_not_off", template_overrides=False, options=options,
                         start=start, end=end, tool_starts=(tool,))

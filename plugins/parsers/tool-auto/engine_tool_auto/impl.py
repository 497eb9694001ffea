"""``--tool-call-parser auto``: detect the format from the chat template, delegate to it."""
from __future__ import annotations

import logging

from engine.api.parsers import PassThroughToolParser
from engine.api import hookimpl

from engine_tool_auto.detect import detect_tool_parser

log = logging.getLogger(__name__)


@hookimpl
def engine_create_tool_parser(chat_template, delegate):
    name = detect_tool_parser(chat_template or "")
    if name is not None:
        try:
            return delegate(name)
        except Exception as exc:  # noqa: BLE001 - a missing plugin must not stop serving
            log.warning("tool parser %r detected but not loadable (%s); passing text through",
                        name, exc)
    else:
        log.warning("no tool-call format detected in the chat template; passing text through")
    return lambda *, tools: PassThroughToolParser(tools=tools)

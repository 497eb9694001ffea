"""GigaChat 3: a single JSON call (wire format and notes in README.md)."""
from engine.api.parsers import JsonTagParser
from engine.api import hookimpl


class GigaChat3ToolParser(JsonTagParser):
    start_markers = (
        "<|message_sep|>function call<|role_sep|>",
        "function call<|role_sep|>",
        "<|function_call|>",
    )
    # a separator not directly followed by the call header (``<|message_sep|>\n\nfunction
    # call``) is a control token all the same: never content
    drop_markers = ("</s>", "<|message_sep|>")
    incremental = True
    parallel_calls = False

    def advance(self, text, block, final):
        if not block.calls and self._next_index:  # only one call per response
            block.invalid = True
            return
        super().advance(text, block, final)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: GigaChat3ToolParser(tools=tools)

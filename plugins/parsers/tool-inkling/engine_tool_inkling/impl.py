"""Inkling tool-invocation messages (wire format and notes in README.md)."""
from engine.api.parsers import (
    CallState,
    JsonCallStreamer,
    StreamingToolParser,
    close_block_after,
)
from engine.api import hookimpl

TOOL_JSON = "<|content_invoke_tool_json|>"
END = "<|end_message|>"


class InklingToolParser(StreamingToolParser):
    """``<|message_model|>NAME<|content_invoke_tool_json|>{"name": NAME, "args": {...}}``
    ``<|end_message|>``. Other Inkling control tokens are removed from the content."""

    start_markers = ("<|message_model|>",)
    drop_markers = (
        "<|content_thinking|>", "<|content_text|>", END, "<|content_model_end_sampling|>",
        TOOL_JSON, "<|content_invoke_tool_text|>", "<|content_invoke_tool|>",
        "<|model_trigger_generation|>",
    )

    def advance(self, text, block, final):
        if not block.calls:
            k = text.find("<|", block.scan)
            if k < 0 or (not final and TOOL_JSON.startswith(text[k:])):
                if final or len(text) - block.scan > 256:
                    block.invalid = True
                return
            if not text.startswith(TOOL_JSON, k):  # not a tool message: drop the framing
                block.end, block.replace = block.scan, ""
                return
            call = CallState(start=block.start)
            call.data = JsonCallStreamer(name_keys=("name",), args_keys=("args",))
            block.header = text[block.scan : k].strip()
            block.calls.append(call)
            block.scan = k + len(TOOL_JSON)
        call = block.calls[0]
        js = call.data
        if not js.done:
            block.scan = js.feed(text, block.scan)
            if js.name is not None and js.name != block.header:
                block.invalid = True
                return
            call.name = js.name  # published before judging, so every chunking decides alike
            if js.failed or js.invalid:
                block.invalid = True
                return
            if not js.done:
                return
            call.arguments, call.done, call.end = js.arguments, True, block.scan
        close_block_after(text, block, call, END, final)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: InklingToolParser(tools=tools)

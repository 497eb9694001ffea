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
    ``<|end_message|>``; the block may also start at ``<|content_invoke_tool_json|>`` (no
    header: any payload name). Other Inkling control tokens are removed from the content, and a
    rejected payload is content without its framing (header and control tokens)."""

    start_markers = ("<|message_model|>", TOOL_JSON)
    drop_markers = (
        "<|content_thinking|>", "<|content_text|>", END, "<|content_model_end_sampling|>",
        "<|content_invoke_tool_text|>", "<|content_invoke_tool|>",
        "<|model_trigger_generation|>",
    )

    def advance(self, text, block, final):
        if getattr(block, "rejected_at", None) is not None:
            self._reject(text, block, final)
            return
        if not block.calls:
            if block.marker == TOOL_JSON:
                k, block.header = block.start, None
            else:
                k = text.find("<|", block.scan)
                if k < 0 or (not final and TOOL_JSON.startswith(text[k:])):
                    if final or len(text) - block.scan > 256:
                        block.invalid = True
                    return
                if not text.startswith(TOOL_JSON, k):  # not a tool message: drop the framing
                    block.end, block.replace = block.scan, ""
                    return
                block.header = text[block.scan : k].strip() or None
            call = CallState(start=block.start)
            call.data = JsonCallStreamer(name_keys=("name",), args_keys=("args",))
            block.calls.append(call)
            block.scan = k + len(TOOL_JSON)
            block.payload_at = block.scan
        call = block.calls[0]
        js = call.data
        if not js.done:
            block.scan = js.feed(text, block.scan)
            if js.name is not None and block.header is not None and js.name != block.header:
                self._reject(text, block, final)
                return
            call.name = js.name  # published before judging, so every chunking decides alike
            if js.failed or js.invalid:
                self._reject(text, block, final)
                return
            if not js.done:
                return
            if js.name is None:  # a payload without a name: rejected like a malformed one
                self._reject(text, block, final)
                return
            call.arguments, call.done, call.end = js.arguments, True, block.scan
        close_block_after(text, block, call, END, final)

    def _reject(self, text, block, final):
        """A malformed or mismatched payload: the block runs to its ``<|end_message|>`` (or
        the end of the text) and stands for the payload text alone."""
        if getattr(block, "rejected_at", None) is None:
            block.rejected_at = block.scan
        j = text.find(END, block.rejected_at)
        if j < 0 and not final:
            block.rejected_at = max(block.rejected_at, len(text) - len(END) + 1)
            return
        stop = j if j >= 0 else len(text)
        block.end = stop + len(END) if j >= 0 else stop
        block.replace, block.invalid = text[block.payload_at : stop], True


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: InklingToolParser(tools=tools)

"""The deepseek-v4 reasoning parser: a configuration of the shared tag splitter.

A continued assistant message (``continue_final_message``) is rendered by the DeepSeek-V4
encoding as the answer, after ``</think>``: the prefill is read behind ``</think>``, so the
continuation is content whatever ``thinking`` says.
"""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "deepseek-v4",
        policy="explicit_thinking",
        chat_template=chat_template,
        options=options,
        tool_starts=("<｜DSML｜",),
        prefill_prefix="</think>",
    )

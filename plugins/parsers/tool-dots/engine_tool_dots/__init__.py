"""dots tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="dots",
    family="tool_parser",
    implementation="engine_tool_dots.impl",
    description="dots.llm tool calls: <invoke>/<parameter> or JSON inside <dots_function_call>",
)

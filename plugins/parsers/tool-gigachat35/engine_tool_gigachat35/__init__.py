"""GigaChat 3.5 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="gigachat35",
    family="tool_parser",
    implementation="engine_tool_gigachat35.impl",
    description="GigaChat 3.5 tool calls: GCML <｜GCML｜tool_calls> invoke/parameter blocks",
)

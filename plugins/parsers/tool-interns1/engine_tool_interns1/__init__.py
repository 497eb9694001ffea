"""InternLM2 / Intern-S1 tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="interns1",
    family="tool_parser",
    implementation="engine_tool_interns1.impl",
    description='InternLM2 / Intern-S1 tool calls: JSON in <|action_start|><|plugin|> blocks',
)

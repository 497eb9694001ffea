"""gpt-oss Harmony tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="gpt-oss",
    family="tool_parser",
    implementation="engine_tool_gpt_oss.impl",
    description='gpt-oss Harmony tool calls: commentary to=functions.NAME messages',
)

"""Nanbeige tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="nanbeige",
    family="tool_parser",
    implementation="engine_tool_nanbeige.impl",
    description="Nanbeige 4.2 tool calls: Qwen3-Coder XML or Qwen JSON inside <tool_call>",
    notes=(
        '[less certain] format from the Nanbeige4.2 chat template; no reference parser found',
    ),
)

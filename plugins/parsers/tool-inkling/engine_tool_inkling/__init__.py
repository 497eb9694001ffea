"""Inkling tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="inkling",
    family="tool_parser",
    implementation="engine_tool_inkling.impl",
    description=(
        "Inkling tool calls: "
        "<|message_model|>NAME<|content_invoke_tool_json|>{name, args}<|end_message|>"
    ),
)

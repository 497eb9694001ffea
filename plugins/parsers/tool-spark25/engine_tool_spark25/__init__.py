"""Spark 2.5 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="spark25",
    family="tool_parser",
    implementation="engine_tool_spark25.impl",
    description="Spark 2.5 tool calls: adjacent <arg_key>/<arg_value> pairs, compact JSON",
)

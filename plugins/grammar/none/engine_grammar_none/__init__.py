"""The none grammar backend: manifest only."""
from engine.api import Plugin

plugin = Plugin(
    name="none",
    family="grammar",
    implementation="engine_grammar_none.impl",
    description="No constrained decoding: a request asking for a constraint gets HTTP 400",
    priority=0,
)

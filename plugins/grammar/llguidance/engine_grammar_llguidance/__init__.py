"""llguidance grammar backend: manifest only (the library loads on selection)."""
from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="llguidance",
    family="grammar",
    implementation="engine_grammar_llguidance.impl",
    description="llguidance: JSON schemas, any JSON object, regexes and Lark/GBNF grammars; "
                "masks computed on the CPU in microseconds, any device",
    requires=Requires(packages=("llguidance>=1.0",)),
    priority=30,
    options=(
        Option("--constrained-json-whitespace-pattern", type="str", default=None,
               help="Regex of the whitespace allowed between JSON tokens (default: any run "
                    "of spaces, tabs and newlines), e.g. '[ ]?'."),
        Option("--constrained-json-disable-any-whitespace", type="bool", default=False,
               help="Compact JSON: no whitespace between JSON tokens."),
    ),
)

"""outlines grammar backend: manifest only (the library loads on selection)."""
from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="outlines",
    family="grammar",
    implementation="engine_grammar_outlines.impl",
    description="outlines-core: JSON schemas, any JSON object and regexes, compiled to a token "
                "automaton (no EBNF grammars)",
    requires=Requires(packages=("outlines-core>=0.2",)),
    priority=10,
    options=(
        Option("--outlines-json-whitespace-pattern", type="str", default=None,
               help="Regex of the whitespace allowed between JSON tokens (default: outlines' "
                    "own, at most one space)."),
    ),
    notes=("tokenizers with a byte-level decoder (GPT-2 style) or SentencePiece byte "
           "fallback (Llama style)",
           "numeric bounds (minimum/maximum, exclusive too), which outlines-core ignores, "
           "are enforced by this plugin; a number near a non-integer bound is written as an "
           "integer, and exponents are not produced"),
)

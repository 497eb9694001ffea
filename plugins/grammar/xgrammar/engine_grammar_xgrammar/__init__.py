"""xgrammar grammar backend: manifest only (the library loads on selection)."""
from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="xgrammar",
    family="grammar",
    implementation="engine_grammar_xgrammar.impl",
    description="xgrammar: JSON schemas, any JSON object, regexes and EBNF (GBNF) grammars",
    requires=Requires(packages=("xgrammar>=0.1.20",)),
    priority=20,
    notes=("xgrammar 0.2.9 lets length-bounded strings hold raw control characters, which "
           "JSON forbids: this plugin gives such strings a pattern over characters that need "
           "no escape (no quote, backslash or control character in them)",),
    options=(
        Option("--constrained-json-max-whitespace-cnt", type="int", default=None,
               help="Most consecutive whitespace characters between JSON tokens "
                    "(default: unbounded; small models may write whitespace until max_tokens "
                    "without a bound such as 2)."),
    ),
)

"""A backend that compiles nothing: every constraint is refused with the reason."""
from engine.api import hookimpl
from engine.api.grammar import GrammarBackend, InvalidGrammar


class NoGrammarBackend(GrammarBackend):
    name = "none"
    kinds = ()

    def compile(self, spec):
        raise InvalidGrammar(f"this server runs with --grammar-backend none: {spec.kind} "
                             "constraints (response_format, regex, ebnf, json_schema, "
                             "structural_tag) are not available")


@hookimpl
def engine_create_grammar_backend():
    return NoGrammarBackend()

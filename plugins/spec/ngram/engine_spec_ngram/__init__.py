"""NGRAM speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="ngram",
    family="speculative",
    implementation="engine_spec_ngram.impl",
    description="Drafts a token tree from n-gram matches in the request's own prompt and output "
                "and in every other request's; no draft model",
    requires=Requires(devices=("cpu", "cuda")),
    options=(
        Option("--speculative-ngram-min-bfs-breadth", "int", 1,
               "Fewest branches per tree level (used for the longest matches)."),
        Option("--speculative-ngram-max-bfs-breadth", "int", 10,
               "Most branches per tree level (used for the shortest matches); 1 drafts chains."),
        Option("--speculative-ngram-match-type", "str", "BFS",
               "Which continuations come first: BFS (the most recent) or PROB (the most "
               "frequent).", choices=("BFS", "PROB")),
        Option("--speculative-ngram-max-trie-depth", "int", 18,
               "Longest branch: the most tokens drafted after one match."),
        Option("--speculative-ngram-capacity", "int", 10_000_000,
               "Most tokens of finished requests kept for matching (the least recently "
               "finished go first)."),
        Option("--speculative-ngram-min-match-window-size", "int", 1,
               "Shortest suffix of the request that must match to draft."),
        Option("--speculative-ngram-max-match-window-size", "int", 12,
               "Longest suffix of the request that is matched."),
    ),
)

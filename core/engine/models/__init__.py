"""Models: the normalized config, the architecture registry, weights loading, the tokenizer and
the Llama-family decoder."""

"""Training utilities behind ``recipes/``: corpora, tokenizer, packing, optimiser groups and
schedule, checkpoints. Imports ``datasets`` / ``tokenizers`` / torchtune only in the modules
that need them (``import idmix`` does not import this package)."""

"""The io floor under training, evaluation and hf: files written atomically, checkpoints and
their manifests, the DCP reader that runs no code, plain model descriptions and the trusted
builders, run directories, config checks, tokenizers and corpora. Imports nothing of idmix
above ``modules`` and ``models``."""

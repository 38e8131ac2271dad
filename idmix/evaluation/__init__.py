"""Evaluation and deployment behind ``recipes/``: token scoring, the lm-eval model, length
extrapolation, synthetic recall probes and quantised export. Each module imports its heavy
dependency (lm-eval, torchao, matplotlib) itself; ``import idmix`` does not import this package."""

"""idmix."""

"""New mixers composed from idmix's parts, with no edit to the library (see CONTRIBUTING.md)."""

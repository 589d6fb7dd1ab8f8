"""Tooling around the library: the corpus, frozen-table files, training and describing the tiny pair, the prompt
suites, and the notebooks' runner and helpers. Nothing here decodes."""

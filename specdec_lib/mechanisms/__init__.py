"""The mechanisms: pure functions and small classes on tokens and tensors (no printing, plotting or timing).

Reading order: ngram_table (Cacheback's LRU table, notebook 01) -> draft_tree (trees grown from tables, 02)
-> masks (mask_mods and their per-backend renderers, 02) -> kv_cache (rollback, compaction, the draft's
tracked cache, 02-03) -> verify (one forward of a proposal, the tree walk, speculative sampling, the commit)
-> compression (KV compression functions C, 05) -> flex_layout (FAFO's store: C(kv) contiguous under one static
BlockMask, 05; its FlexAttention/transformers glue in flex_backend).
"""

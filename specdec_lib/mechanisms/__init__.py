"""The mechanisms: functions and small classes on tokens and tensors that the loop and the notebooks use (no
printing or plotting; step_cost and budget time forwards, since "auto" budgets are chosen from measured costs).

Reading order: ngram_table (Cacheback's LRU table, notebook 01) -> draft_tree (trees grown from tables, 02)
-> masks (mask_mods and their per-backend renderers, 02) -> kv_cache (rollback, compaction, the draft's
tracked cache, 02-03) -> verify (one forward of a proposal, the tree walk, speculative sampling, the commit)
-> step_cost (what a forward and a loop step of R rows cost here, 00/08) -> budget (the "auto" draft budgets
from those costs, 08) -> compression (KV compression functions C, 05) -> flex_backend (the store's attention:
compiled flex, or split by row groups) -> flex_layout (FAFO's store: C(kv) contiguous under one static
BlockMask, 05) -> card_tree -> card_drafter -> card_process (CARD's drafter tree, and the drafter in the caller's
thread, a worker thread or a forked process, 07).
"""

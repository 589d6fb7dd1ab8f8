"""The mechanisms: functions and small classes on tokens and tensors that the loop and the notebooks use (no
printing or plotting; step_cost and cost_curve time forwards, since "auto" budgets are chosen from measured
costs).

Reading order: ngram_table (Cacheback's LRU table, notebook 01) -> draft_tree (trees grown from tables, 02)
-> masks (mask_mods and their per-backend renderers, 02) -> kv_cache (rollback, compaction, the draft's
tracked cache, 02-03) -> verify (one forward of a proposal, the tree walk, speculative sampling, the commit)
-> step_cost (what a forward and a loop step of R rows cost here, 00/08) -> cost_curve (those costs as
t(rows, context), cached on disk) -> choosers, side_budget, confidence (the "auto" draft budgets chosen from
them) -> budget (what a method holds, 08) -> dynamic_tree (EAGLE-2's expand-and-rerank tree, for EAGLE's head and
a draft model, 09) -> compression (KV compression functions C, 05) -> flex_backend (the store's glue to
FlexAttention and transformers: BlockMasks from block tables, flex eager or compiled, the attention function)
-> attention (the store's attention, one object per mode: flex, dense, split by row groups, causal)
-> flex_layout (FAFO's store, layout only: C(kv) contiguous under one static BlockMask, 05) -> card_tree
-> card_drafter -> card_process (CARD's drafter tree, and the drafter in the caller's thread, a worker thread or
a forked process, 07).
"""

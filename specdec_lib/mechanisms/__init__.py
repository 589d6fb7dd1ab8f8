"""The mechanisms: functions and small classes on tokens and tensors that the loop and the notebooks use. No
printing or plotting, and no import of methods/, bench/, tools/ or viz/. Clocks are read in two places only:
budget/'s step_cost and cost_curve time forwards ("auto" budgets are chosen from measured costs), and card/
records the drafter's busy intervals (for the timeline).

Reading order (notebook in brackets):
- ngram_table: Cacheback's LRU leader/follower table and its frozen twin (01);
- draft_tree: `DraftTree`, the one tree type of every drafter, and Cacheback's breadth-first growth (02);
- masks: mask_mods (causal, prefix, tree, visible, and/or/by_rows) and their per-backend renderers (02);
- kv_cache: rollback, compaction, `ContiguousLayer`, the draft's `TrackedCache` (02-03);
- verify: `Proposal`/`SideRows`/`Verdict`, one target forward, the tree walk, speculative sampling, the commit
  (02-03);
- store/: FAFO's KV store: compression (the functions C) -> flex_backend (BlockMasks, the attention function
  transformers calls) -> attention (one object per mode) -> layout (`FlexLayoutStore`: C(kv) contiguous
  under one static BlockMask) (07-08);
- card/: CARD's drafter: tree (the width-K scored tree) -> drafter (in the caller's thread or a worker thread)
  -> process (in a forked process) (09);
- dynamic_tree: EAGLE-2's expand-and-rerank tree, for EAGLE's head and for a draft model (11);
- budget/: what a method holds for its draft size (facade `Budget`), the "auto" choosers (choosers, confidence,
  side) and the costs they read (step_cost, cost_curve) (11, 12).
"""

"""Training what the workbook ships: the tiny pair, the drafts and the EAGLE heads (one loop, one schedule).

loop (the cosine schedule, the training loop, the losses, held-out metrics: shared by all) and data (corpus
blocks, the target's own answers and features, the kept vocabulary: shared by the feature-level drafts) ->
train_tiny (the tiny target and draft from scratch on the standard-library corpus) -> distill_draft (a draft
distilled from a target) -> chat_requests + train_smol_draft (the real pair's exit draft on the target's own chat
answers) -> train_eagle (EAGLE heads on a target's features).
"""

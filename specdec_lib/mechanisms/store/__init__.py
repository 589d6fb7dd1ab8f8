"""FAFO's KV store (Zhang et al. 2025, "Fast and Furious... FAFO"; notebooks 07-08): the compressed KV C(kv)
kept physically contiguous beside the full one under one static BlockMask.

compression (the functions C: StreamingLLM, Quest) -> flex_backend (BlockMasks from block tables, flex eager or
compiled, the attention function transformers calls) -> attention (one object per attention mode: flex, dense,
split by row groups, causal) -> layout (`FlexLayoutStore`: the store's layout and its cache interface).
"""

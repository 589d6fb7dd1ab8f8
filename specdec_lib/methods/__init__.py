"""The methods: each registers itself in `specdec_lib.METHODS` when imported.

autoregressive, prompt_lookup, cacheback and draft_model are proposers of the one decoding loop (loop.py);
peers registers Hugging Face's own decoders (hf, hf_prompt_lookup, hf_assisted) to be measured beside them.
No method imports another.
"""
from . import autoregressive, cacheback, draft_model, peers, prompt_lookup  # noqa: F401  (registration)

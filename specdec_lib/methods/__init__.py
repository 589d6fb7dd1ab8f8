"""The methods: each registers itself in `specdec_lib.METHODS` when imported.

autoregressive, prompt_lookup, cacheback, draft_model, card, fafo, lookahead and eagle are proposers of the one decoding loop
(loop.py); peers registers Hugging Face's own decoders (hf, hf_prompt_lookup, hf_assisted) to be measured beside them.
No method imports another.
"""
from . import (autoregressive, cacheback, card, draft_model, eagle, fafo, lookahead, peers,  # noqa: F401 (registration)
               prompt_lookup)

"""Feature data for the drafts that learn a target's hidden states: the exit draft (train_smol_draft) and the
EAGLE heads (train_eagle) read the same blocks, features and kept vocabulary.

- `corpus_blocks`: blocks of 256 tokens from whole files of a corpus split (the standard-library corpus under
  the target's tokenizer), files in a seeded order;
- `own_answers`: the target's greedy answers to chat requests of the benchmark's kinds (`chat_requests`), whole
  sequences (request + answer): what a draft meets at decode time;
- `target_features`: the target's final normed hidden state at every position of the blocks (float16), and
  `target_next`, the target's next token read from them;
- `kept_tokens`: the K tokens the target predicts most often (FR-Spec, Zhao et al. 2025: a frequency-ranked
  subset of the vocabulary for the draft's head);
- `chat_data`: all of it for a chat pair, cached under $SPECDEC_CACHE/smol-draft; a run asking more requests
  than a cached one of the same settings answers only the new ones (`_smaller_data`, `_concat`).

Never HumanEval (a test suite): training text is cut from the corpus's training split, held-out text from its
held-out split. Left out: deduplication of blocks, and answers longer than `new_tokens` (they are cut).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..env import cache_root

BLOCK = 256


def cut_blocks(ids: list[int], block: int = BLOCK, min_len: int = 64) -> list[list[int]]:
    """`ids` cut into consecutive blocks of `block` tokens; a last block shorter than `min_len` is dropped."""
    return [ids[i:i + block] for i in range(0, len(ids), block) if len(ids[i:i + block]) >= min_len]


def corpus_blocks(tokenizer, split: str, tokens: int, seed: int) -> list[list[int]]:
    """Blocks from whole files of a corpus split, files in a seeded order, until `tokens` are taken."""
    from ..corpus import load_corpus

    texts = list(load_corpus(cache_root() / "corpus")[split]["text"])
    random.Random(seed).shuffle(texts)
    out, taken = [], 0
    for text in texts:
        for b in cut_blocks(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]):
            out.append(b)
            taken += len(b)
        if taken >= tokens:
            break
    return out


def own_answers(pair, split: str, requests: int, new_tokens: int, seed: int, batch: int = 32,
                kinds=("code",), start: int = 0) -> list[list[int]]:
    """The target's greedy answers to chat requests of the benchmark's kinds (`chat_requests`: continue a file,
    complete a documented function, write the code after an edit) cut from the split's files, as whole
    sequences (request + answer); requests[start:] only (the draws are seeded in order: the first `start` are
    those a smaller run answered)."""
    from ..corpus import load_corpus
    from .chat_requests import chat_requests

    texts = list(load_corpus(cache_root() / "corpus")[split]["text"])
    tok = pair.tokenizer
    asked = chat_requests(texts, requests, seed, tok, kinds)[start:]
    prompts = [pair.chat_text(prompt, kind) for kind, prompt in asked]
    prompts.sort(key=len)  # batches of like lengths: less left padding to compute
    tok.padding_side = "left"
    out = []
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i:i + batch], add_special_tokens=False, return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = pair.target.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                       pad_token_id=tok.pad_token_id)
        for row, mask in zip(gen, enc["attention_mask"]):
            pad = int((1 - mask).sum())
            ids = row[pad:].tolist()
            while len(ids) > 1 and ids[-1] == ids[-2] == tok.pad_token_id:
                ids.pop()  # an answer that ended early is padded on the right: keep its one end token
            out.append(ids)
        print(f"  own answers {len(out)}/{len(prompts)}", flush=True)
    return out


@torch.no_grad()
def target_features(target, blocks: list[list[int]], batch: int = 8):
    """(ids (N, T), mask (N, T), final normed hidden states (N, T, d) float16) of the blocks, padded to T."""
    T = max(len(b) for b in blocks)
    ids = torch.zeros(len(blocks), T, dtype=torch.long)
    mask = torch.zeros(len(blocks), T, dtype=torch.bool)
    for i, b in enumerate(blocks):
        ids[i, :len(b)], mask[i, :len(b)] = torch.tensor(b), True
    feats = torch.empty(len(blocks), T, target.config.hidden_size, dtype=torch.float16)
    for i in range(0, len(blocks), batch):
        out = target.model(input_ids=ids[i:i + batch].to(target.device),
                           attention_mask=mask[i:i + batch].long().to(target.device))
        feats[i:i + batch] = out.last_hidden_state.to("cpu", torch.float16)  # (b, T, d), after the final norm
        if i % (batch * 10) == 0:
            print(f"  features {i}/{len(blocks)}", flush=True)
    return ids, mask, feats


def target_next(target, feats, batch: int = 16) -> torch.Tensor:
    """(N, T): the target's next token (argmax of its output layer) at every position of the features."""
    head = target.get_output_embeddings()
    return torch.cat([head(feats[i:i + batch].float()).argmax(-1) for i in range(0, len(feats), batch)])


def kept_tokens(next_ids: torch.Tensor, mask: torch.Tensor, vocab: int, k: int) -> torch.Tensor:
    """The `k` token ids the target predicts most often at the kept positions, in increasing order."""
    counts = torch.bincount(next_ids[mask], minlength=vocab)
    return counts.argsort(descending=True)[:k].sort().values


def data_name(corpus_tokens: int, requests: int, new_tokens: int, seed: int, kinds=("code",)) -> str:
    tag = "" if tuple(kinds) == ("code",) else "_" + "-".join(kinds)  # the first data asked only to continue
    return f"data_c{corpus_tokens}_r{requests}_n{new_tokens}_s{seed}{tag}.pt"


def chat_cache() -> Path:
    """Where `chat_data` (and train_smol_draft's trained candidates) are cached."""
    return cache_root() / "smol-draft"


def _smaller_data(work: Path, corpus_tokens: int, requests: int, new_tokens: int, seed: int, kinds):
    """(requests, file) of the cached data of these settings with the most requests below `requests`, or None."""
    found = [(r, work / data_name(corpus_tokens, r, new_tokens, seed, kinds)) for r in range(1, requests)]
    found = [(r, f) for r, f in found if f.is_file()]
    return max(found) if found else None


def _concat(old: dict, ids, mask, feats) -> dict:
    """The old split's rows then the new ones, padded to the longer of the two block lengths."""
    T = max(old["ids"].shape[1], ids.shape[1])

    def pad(t):
        return F.pad(t, (0, 0, 0, T - t.shape[1])) if t.dim() == 3 else F.pad(t, (0, T - t.shape[1]))
    return dict(ids=torch.cat([pad(old["ids"]), pad(ids)]), mask=torch.cat([pad(old["mask"]), pad(mask)]),
                feats=torch.cat([pad(old["feats"]), pad(feats)]), corpus_blocks=old["corpus_blocks"])


def chat_data(pair, corpus_tokens: int, requests: int, new_tokens: int, seed: int, kinds=("code",)) -> dict:
    """{"splits": {"train"|"heldout": {"ids", "mask", "feats", "corpus_blocks"}}, "seconds"}: corpus blocks and
    the target's own answers with their features, for a chat pair, cached in `chat_cache()`. A cached run of the
    same settings with fewer requests is extended: only the new requests are answered (the held-out split grows
    with it, requests // 6)."""
    work = chat_cache()
    work.mkdir(parents=True, exist_ok=True)
    data_file = work / data_name(corpus_tokens, requests, new_tokens, seed, kinds)
    if data_file.is_file():
        return torch.load(data_file)
    t0 = time.time()
    base = _smaller_data(work, corpus_tokens, requests, new_tokens, seed, kinds)
    old = torch.load(base[1]) if base else None
    print(f"1. data: the target's answers to requests {base[0]}+ ({base[1].name} holds the rest)" if base
          else "1. data: the corpus and the target's own answers", flush=True)
    splits = {}
    for split, tokens, n_requests, split_seed in (("train", corpus_tokens, requests, seed),
                                                  ("heldout", corpus_tokens // 6, requests // 6, seed + 1)):
        start = (base[0] if split == "train" else base[0] // 6) if base else 0
        blocks = [] if base else corpus_blocks(pair.tokenizer, split, tokens, split_seed)
        n_corpus = len(blocks)
        answers = own_answers(pair, split, n_requests, new_tokens, split_seed, kinds=kinds, start=start)
        blocks += [b for a in answers for b in cut_blocks(a)]
        print(f"2. target features ({split}: {len(blocks)} blocks)", flush=True)
        ids, mask, feats = target_features(pair.target, blocks)
        splits[split] = (_concat(old["splits"][split], ids, mask, feats) if base
                         else dict(ids=ids, mask=mask, feats=feats, corpus_blocks=n_corpus))
    data = dict(splits=splits, seconds=time.time() - t0 + (old["seconds"] if base else 0.0))
    torch.save(data, data_file)
    return data

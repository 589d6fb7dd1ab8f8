"""Train an EAGLE head for a target on the CPU (`make eagle`, `make smol-eagle`).

Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (the head: eagle_head.py).

    python -m specdec_lib.training.train_eagle --models tiny --out data/models/eagle-tiny --minutes 4

1. data (`data.py`), never HumanEval: blocks of 256 tokens from the standard-library corpus's training split
   (held out: the held-out files), and the target's own greedy text, what the head meets at decode time (every
   accepted token is the target's choice): continuations of 64-token openings cut from corpus files, or for a
   chat model its answers to chat requests of the benchmark's kinds (`data.chat_data`, shared with its exit draft);
2. the target's final normed hidden state at every position (float16), computed once and cached under
   $SPECDEC_CACHE/eagle: the features the head reads and the ones it learns to predict;
3. for a large vocabulary (> 16k tokens), the kept tokens: the `--keep` the target predicts most often (FR-Spec);
4. training, teacher-forced as in EAGLE: row t reads (f_t + noise, embed(x_{t+1})) and predicts f_{t+1}; loss
   smooth-L1 on the feature + `--ce-weight` x soft cross-entropy between the target's distribution at t+1 and the
   head's, both read through the target's frozen LM head (over the kept tokens when there are). Uniform noise of
   `--noise` x the features' RMS on the input features (EAGLE: the head must cope with its own errors at depth
   > 1). AdamW, `loop.lr_at` (a cosine over the seconds of `--minutes`, no warm-up), a progress bar;
5. measured: held-out teacher-forced top-1 agreement (the head's token = the target's), before and after, and
   the acceptance by depth of a greedy chain drafted by the head on held-out text (free running: each depth reads
   the head's own predicted feature); saved with these in eagle.json.

Left out: one learning rate; the chain acceptance is measured on teacher-forced prefixes of held-out text (the
target's own output is what the loop verifies; the corpus text is close to it for the tiny target).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from ..models.eagle_head import EagleHead, save_head, target_fingerprint
from ..env import cache_root
from ..models.loading import load_models
from .chat_requests import KINDS
from .data import BLOCK, chat_data, corpus_blocks, kept_tokens, target_features, target_next
from .loop import agreement_share, masked_smooth_l1, soft_cross_entropy, train_loop


def own_continuations(pair, split: str, sequences: int, prefix: int, new_tokens: int, seed: int,
                      batch: int = 32) -> list[list[int]]:
    """The target's greedy continuations of `prefix`-token openings cut from corpus files (prefix + continuation):
    the text the head meets at decode time, where every accepted token is the target's own choice."""
    openings = [b[:prefix] for b in corpus_blocks(pair.tokenizer, split, sequences * 256, seed) if len(b) >= prefix]
    openings = openings[:sequences]
    out = []
    for i in range(0, len(openings), batch):
        ids = torch.tensor(openings[i:i + batch])  # (b, prefix): equal lengths, no padding
        with torch.no_grad():
            gen = pair.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, do_sample=False,
                                       pad_token_id=pair.tokenizer.pad_token_id)
        out += gen.tolist()
    return out


def build_data(pair, split: str, tokens: int, sequences: int, seed: int) -> dict:
    """{"ids", "mask", "feats"} of one split: corpus blocks and the target's own continuations (see the module
    doc), cached per target and setting."""
    path = cache_root() / "eagle" / f"data_{target_fingerprint(pair.target)}_{split}_c{tokens}_o{sequences}_s{seed}.pt"
    if path.is_file():
        return torch.load(path)
    blocks = corpus_blocks(pair.tokenizer, split, tokens, seed) if tokens else []
    if sequences:
        print(f"  the target's own continuations of {sequences} {split} openings", flush=True)
        blocks += own_continuations(pair, split, sequences, 64, BLOCK - 64, seed)
    print(f"  target features of {len(blocks)} {split} blocks", flush=True)
    ids, mask, feats = target_features(pair.target, blocks)
    data = dict(ids=ids, mask=mask, feats=feats)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return data


def _inputs(head, target, ids, mask, feats, noise: float = 0.0):
    """Teacher-forced rows: features f_0..f_{T-2} (+ noise), embeddings of x_1..x_{T-1}; targets f_1..f_{T-1}."""
    dtype = head.fc.weight.dtype
    f_in = feats[:, :-1].to(dtype)  # (b, T-1, d)
    if noise:
        scale = noise * f_in.pow(2).mean().sqrt()
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * scale
    embeds = target.get_input_embeddings()(ids[:, 1:]).detach()  # (b, T-1, d)
    pos = torch.arange(ids.shape[1] - 1, device=ids.device)[None].expand(ids.shape[0], -1)  # (b, T-1)
    return head(f_in, embeds, pos), feats[:, 1:].to(dtype), mask[:, 1:]


def losses(head, target, ids, mask, feats, ce_weight: float, noise: float, ce_stride: int = 4):
    pred, want, m = _inputs(head, target, ids, mask, feats, noise)  # (b, T-1, d) x2, (b, T-1)
    reg = masked_smooth_l1(pred, want, m, mask_dtype=torch.float32)
    # the soft cross-entropy on every `ce_stride`-th row only: the LM head is most of a step's arithmetic
    pred, want, m = pred[:, ::ce_stride], want[:, ::ce_stride], m[:, ::ce_stride]
    q_log = F.log_softmax(head.logits(target, pred)[0], -1)  # (b, rows, K)
    with torch.no_grad():
        p = F.softmax(head.logits(target, want)[0], -1)  # the target's distribution (over the kept tokens)
    ce = soft_cross_entropy(q_log, p, m)
    return reg + ce_weight * ce, reg.item(), ce.item()


@torch.no_grad()
def agreement(head, target, data, batch: int = 16) -> float:
    """Held-out share of positions where the head's argmax (teacher-forced) is the target's next token."""
    def pieces():
        for i in range(0, len(data["ids"]), batch):
            ids, mask, feats = (data[k][i:i + batch].to(head.fc.weight.device) for k in ("ids", "mask", "feats"))
            pred, want, m = _inputs(head, target, ids, mask, feats)
            guess, keep = head.logits(target, pred)
            truth = target.get_output_embeddings()(want).argmax(-1)  # (b, T-1): the target's token
            yield keep[guess.argmax(-1)] if keep is not None else guess.argmax(-1), truth, m
    return agreement_share(pieces())


@torch.no_grad()
def chain_acceptance(head, target, data, depth: int = 6, prefixes: int = 48, seed: int = 0) -> list[float]:
    """P(depth d accepted | depths < d accepted), d = 1..depth, of a greedy chain the head drafts free-running
    (each depth reads the head's own predicted features) after held-out prefixes. The truth is the target's
    argmax after each position; a depth is counted only while the held-out text so far is the target's own greedy
    choice (else the truth after it is unknown without another target forward)."""
    gen = torch.Generator().manual_seed(seed)
    reached, accepted = [0] * depth, [0] * depth
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    for _ in range(prefixes):
        i = int(torch.randint(len(data["ids"]), (1,), generator=gen))
        n = int(data["mask"][i].sum())
        if n < 64 + depth + 2:
            continue
        T = int(torch.randint(32, n - depth - 2, (1,), generator=gen))  # the root's position
        device = head.fc.weight.device
        feats, ids = data["feats"][i, :n].to(device, head.fc.weight.dtype), data["ids"][i, :n].to(device)
        truth = lm_head(feats).argmax(-1)  # (n,): the target's token after each position
        seq_f, seq_x = feats[:T], ids[1:T + 1]  # rows (f_t, x_{t+1}), t < T
        for d in range(depth):
            guess = head(seq_f[None], embed(seq_x[None]), torch.arange(len(seq_x), device=device)[None])[0, -1]
            logits, keep = head.logits(target, guess)
            token = int(keep[logits.argmax()]) if keep is not None else int(logits.argmax())
            reached[d] += 1
            if token != int(truth[T + d]):
                break
            accepted[d] += 1
            if int(ids[T + d + 1]) != token:  # the held-out text leaves the target's greedy path here
                break
            seq_f = torch.cat([seq_f, guess[None]])  # the head's own feature, as at decode time
            seq_x = torch.cat([seq_x, torch.tensor([token], device=device)])
    return [a / r if r else float("nan") for a, r in zip(accepted, reached)]


def train(head, target, data, minutes: float | None, lr: float, ce_weight: float, noise: float, batch: int,
          seed: int, steps: int | None = None, progress: bool = True):
    """Train `head` for `minutes` (or exactly `steps` steps: reproducible, for tests); returns the loss history."""
    if (minutes is None) == (steps is None):
        raise ValueError("give minutes or steps")
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)

    def loss_fn(step):
        pick = torch.randint(len(data["ids"]), (batch,), generator=gen)
        device = head.fc.weight.device  # the data stays on the CPU; each batch goes to the head's device
        loss, reg, ce = losses(head, target, *(data[k][pick].to(device) for k in ("ids", "mask", "feats")),
                               ce_weight, noise)
        return loss, dict(regression=reg, ce=ce)

    head.train()
    history = train_loop(opt, loss_fn, lr, steps=steps, minutes=minutes, by_time=True, record_every=10,
                         desc="training the head" if progress else None)
    head.eval()
    return history


@torch.no_grad()
def own_text(target, sequences: int = 16, prompt_len: int = 8, length: int = 96, seed: int = 0) -> dict:
    """{"ids", "mask", "feats"} of the target's own greedy continuations of random prompts: training data for
    any target, no corpus or tokenizer needed (tests, random models)."""
    from .. import generate

    gen = torch.Generator().manual_seed(seed)
    vocab = target.get_output_embeddings().out_features
    rows = []
    for _ in range(sequences):
        prompt = torch.randint(vocab, (1, prompt_len), generator=gen).to(target.device)
        out = generate("autoregressive", target, prompt, length - prompt_len).new_tokens
        rows.append(prompt[0].tolist() + out)
    ids = torch.tensor(rows, device=target.device)  # (N, length)
    feats = target.model(input_ids=ids).last_hidden_state  # (N, length, d), after the final norm
    return dict(ids=ids, mask=torch.ones_like(ids, dtype=torch.bool), feats=feats)


def quick_head(target, steps: int = 300, sequences: int = 16, length: int = 96, seed: int = 0,
               lr: float = 3e-3) -> EagleHead:
    """A head trained `steps` steps on the target's own greedy text (own_text): what a test or a notebook with a
    pair that has no shipped head can build in seconds to minutes (depending on the target's size)."""
    torch.manual_seed(seed)
    data = own_text(target, sequences, length=length, seed=seed)
    head = EagleHead.for_target(target)
    train(head, target, data, None, lr, 0.1, 0.05, min(8, sequences), seed, steps=steps, progress=False)
    return head


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny", help='"tiny" or "smol" (any pair load_models takes)')
    ap.add_argument("--out", default="data/models/eagle-tiny")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--corpus-tokens", type=int, default=300_000, help="chat models: as their exit draft's (60k)")
    ap.add_argument("--requests", type=int, default=480, help="chat requests the target answers (chat models)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="kinds of chat request (training/chat_requests.py), comma separated (chat models)")
    ap.add_argument("--continuations", type=int, default=512,
                    help="the target's own continuations of corpus openings (other models)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--keep", type=int, default=8192, help="kept tokens for vocabularies over 16k")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    pair = load_models(args.models, dtype="float32", prepack=False)
    target = pair.target.requires_grad_(False)
    print(f"1-2. data and the target's features ({pair.name})", flush=True)
    if pair.chat:  # a chat model: the corpus and its own answers, shared with its exit draft's trainer
        splits = chat_data(pair, args.corpus_tokens, args.requests, args.new_tokens, args.seed,
                           tuple(args.kinds.split(",")))["splits"]
        train_data, held = splits["train"], splits["heldout"]
    else:
        train_data = build_data(pair, "train", args.corpus_tokens, args.continuations, args.seed)
        held = build_data(pair, "heldout", args.corpus_tokens // 10, args.continuations // 10, args.seed + 1)
    keep = None
    vocab = target.get_output_embeddings().out_features
    if vocab > 16384:
        keep = kept_tokens(target_next(target, train_data["feats"]), train_data["mask"], vocab, args.keep)
        print(f"3. kept the {args.keep} tokens the target predicts most often", flush=True)
    head = EagleHead.for_target(target, keep_ids=keep)
    before = agreement(head, target, held)
    print(f"4. training {args.minutes} min (held-out agreement before: {before:.3f})", flush=True)
    history = train(head, target, train_data, args.minutes, args.lr, args.ce_weight, args.noise, args.batch,
                    args.seed)
    after = agreement(head, target, held)
    chain = chain_acceptance(head, target, held)
    print(f"5. held-out agreement {after:.3f}; chain acceptance by depth {[round(a, 3) for a in chain]}", flush=True)
    extra = dict(pair=pair.name, measured=dict(agreement_untrained=round(before, 4), agreement=round(after, 4),
                                                chain_acceptance=[None if math.isnan(a) else round(a, 4)
                                                                  for a in chain]),  # None: depth never reached
                 data=dict(block=BLOCK, corpus_tokens=args.corpus_tokens, requests=args.requests if pair.chat else 0,
                           kinds=args.kinds.split(",") if pair.chat else [],
                           continuations=0 if pair.chat else args.continuations,
                           train_tokens=int(train_data["mask"].sum()), heldout_tokens=int(held["mask"].sum())),
                 training=dict(minutes=args.minutes, steps=history[-1]["step"] if history else 0, lr=args.lr,
                               ce_weight=args.ce_weight, noise=args.noise, batch=args.batch, seed=args.seed),
                 history=history[::max(1, len(history) // 60)])
    save_head(head, args.out, target, extra)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()

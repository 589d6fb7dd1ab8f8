"""Train SmolLM2-135M-Instruct's draft on this CPU, choosing among exit drafts by measurement (`make smol-draft`).

    python -m specdec_lib.training.train_smol_draft --out data/models/smol-draft --minutes 6

What it does, each step cached under $SPECDEC_CACHE/smol-draft so a rerun resumes (and a run asking more requests
than a cached one answers only the new ones):
1. data, never HumanEval (a test suite): blocks of 256 tokens from the standard-library corpus's training split
   (the tiny pair's corpus, under SmolLM2's tokenizer), and the model's own greedy answers to chat requests of
   the benchmark's three kinds cut from training files (`chat_requests`: continue a file, complete a documented
   function, write the code after an edit): what the draft meets at decode time, a chat turn, then the target's
   own answer. Held out: the corpus's held-out files and answers to requests cut from them. (The first shipped
   draft asked only to continue a file, and agreed with the target's HumanEval answers 0.24 of the time.);
2. the target's final normed hidden state at every position of every block (float16): the features each
   candidate learns to match, and the target's next token (its argmax) for agreement;
3. the kept vocabulary: the K tokens the target predicts most often on the training blocks (FR-Spec's
   frequency-ranked subset), with their coverage of the held-out next tokens;
4. each candidate `ExitDraft(frozen, trained)` trained for `--minutes` (the same budget for all): smooth-L1
   between the draft's normed hidden state and the target's, plus `--ce-weight` x soft cross-entropy between the
   two distributions over the kept tokens (the target's read through the same head rows), AdamW, cosine
   schedule; a trained candidate is cached, so a rerun with other candidates trains only the new ones;
5. measured: held-out top-1 agreement a with the target (teacher-forced) and the cost ratio c (one draft forward
   / one target forward after a 256-token prefix, this machine), ranked by the chain model E[tokens] / step
   cost at the best gamma (bench.costs.expected_speedup);
6. the winner trains `--final-minutes` more, is measured again and saved with every measurement in draft.json.

Simplifications: teacher-forced agreement (the draft reads the target's text, as verification guarantees up to
the first rejection); one learning rate for all candidates; the kept set chosen once, not per candidate.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.exit_draft import build_exit_draft, save_exit_draft, trained_parameters
from ..env import cache_root
from ..models.smol import ensure_smol_dir
from .chat_requests import KINDS

BLOCK = 256
CANDIDATES = ((0, 2), (2, 2), (4, 1))  # (frozen, trained): a small distilled draft, and two early exits


def _blocks(ids: list[int], block: int = BLOCK, min_len: int = 64) -> list[list[int]]:
    return [ids[i:i + block] for i in range(0, len(ids), block) if len(ids[i:i + block]) >= min_len]


def corpus_blocks(tokenizer, split: str, tokens: int, seed: int) -> list[list[int]]:
    """Blocks from whole files of a corpus split, files in a seeded order, until `tokens` are taken."""
    from ..corpus import load_corpus

    texts = list(load_corpus(cache_root() / "corpus")[split]["text"])
    random.Random(seed).shuffle(texts)
    out, taken = [], 0
    for text in texts:
        for b in _blocks(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]):
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


def draft_hidden(draft, ids, mask):
    return draft.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (b, T, d), normed


def losses(draft, ids, mask, feats, ce_weight: float):
    h = draft_hidden(draft, ids, mask)  # (b, T, d)
    target_h = feats.to(h.dtype)
    m = mask.unsqueeze(-1).to(h.dtype)
    reg = (F.smooth_l1_loss(h, target_h, reduction="none") * m).sum() / (m.sum() * h.shape[-1])
    head = draft.lm_head
    q_log = F.log_softmax(head.subset_logits(h), -1)  # (b, T, K)
    p = F.softmax(head.subset_logits(target_h), -1)  # (b, T, K): the target's distribution over the kept tokens
    ce = -((p * q_log).sum(-1) * mask).sum() / mask.sum()
    return reg + ce_weight * ce, reg.item(), ce.item()


@torch.no_grad()
def agreement(draft, target_next, ids, mask, batch: int = 16) -> float:
    """Share of held-out positions where the draft's argmax equals the target's next token."""
    hits = total = 0
    for i in range(0, len(ids), batch):
        h = draft_hidden(draft, ids[i:i + batch], mask[i:i + batch])
        guess = draft.lm_head.ids[draft.lm_head.subset_logits(h).argmax(-1)]  # (b, T)
        m = mask[i:i + batch]
        hits += int(((guess == target_next[i:i + batch]) & m).sum())
        total += int(m.sum())
    return hits / max(total, 1)


def target_next(target, feats, batch: int = 16) -> torch.Tensor:
    head = target.get_output_embeddings()
    return torch.cat([head(feats[i:i + batch].float()).argmax(-1) for i in range(0, len(feats), batch)])


def train(draft, data, minutes: float, lr: float, ce_weight: float, batch: int, seed: int, log=print):
    ids, mask, feats = data
    params = trained_parameters(draft)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    draft.train()
    start, step, history = time.time(), 0, []
    est_steps = None
    while True:
        elapsed = time.time() - start
        if elapsed > minutes * 60:
            break
        if step == 5:  # the schedule's length from the measured speed
            est_steps = max(10, int(minutes * 60 / (elapsed / 5)))
        frac = min(1.0, step / est_steps) if est_steps else 0.0
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        pick = torch.randint(0, len(ids), (batch,), generator=gen)
        loss, reg, ce = losses(draft, ids[pick], mask[pick], feats[pick], ce_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 25 == 0:
            history.append(dict(step=step, seconds=round(time.time() - start, 1), loss=round(loss.item(), 4),
                                reg=round(reg, 4), ce=round(ce, 4)))
            log(f"    step {step} {history[-1]}")
    draft.eval()
    return history


def cost_ratio(target, draft) -> float:
    """One draft forward over one target forward, each after a 256-token cached prefix (this machine)."""
    from ..mechanisms.budget.step_cost import forward_cost

    t = float(forward_cost(target, rows=[1], repeats=15)["median_ms"].iloc[0])
    d = float(forward_cost(draft, rows=[1], repeats=15)["median_ms"].iloc[0])
    return d / t


def data_name(corpus_tokens: int, requests: int, new_tokens: int, seed: int, kinds=("code",)) -> str:
    tag = "" if tuple(kinds) == ("code",) else "_" + "-".join(kinds)  # the first data asked only to continue
    return f"data_c{corpus_tokens}_r{requests}_n{new_tokens}_s{seed}{tag}.pt"


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
    """{"splits": {"train"|"heldout": {"ids", "mask", "feats", "corpus_blocks"}}, "seconds"}: steps 1-2 of the
    module doc for a chat pair, cached under $SPECDEC_CACHE/smol-draft (the EAGLE head's trainer reads it too).
    A cached run of the same settings with fewer requests is extended: only the new requests are answered (the
    held-out split grows with it, requests // 6)."""
    work = cache_root() / "smol-draft"
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
        blocks += [b for a in answers for b in _blocks(a)]
        print(f"2. target features ({split}: {len(blocks)} blocks)", flush=True)
        ids, mask, feats = target_features(pair.target, blocks)
        splits[split] = (_concat(old["splits"][split], ids, mask, feats) if base
                         else dict(ids=ids, mask=mask, feats=feats, corpus_blocks=n_corpus))
    data = dict(splits=splits, seconds=time.time() - t0 + (old["seconds"] if base else 0.0))
    torch.save(data, data_file)
    return data


def main(argv=None):
    from ..bench.costs import expected_speedup
    from ..models.loading import ModelPair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/models/smol-draft")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time per candidate (the comparison)")
    ap.add_argument("--final-minutes", type=float, default=35.0, help="more training for the chosen candidate")
    ap.add_argument("--candidates", default=",".join(f"{f}+{t}" for f, t in CANDIDATES),
                    help="frozen+trained layer counts, comma separated")
    ap.add_argument("--keep", type=int, default=8192, help="kept vocabulary size K")
    ap.add_argument("--corpus-tokens", type=int, default=60_000)
    ap.add_argument("--requests", type=int, default=960, help="chat requests the target answers (training)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="kinds of request (tools/chat_requests.py), comma separated")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ce-weight", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_smol_dir()
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    pair = ModelPair(target=target, draft=None, tokenizer=tok, device=torch.device("cpu"), name="smol", chat=True)
    kinds = tuple(args.kinds.split(","))
    data = chat_data(pair, args.corpus_tokens, args.requests, args.new_tokens, args.seed, kinds)
    work = cache_root() / "smol-draft"
    data_file = work / data_name(args.corpus_tokens, args.requests, args.new_tokens, args.seed, kinds)
    train_data, held = data["splits"]["train"], data["splits"]["heldout"]
    held_next = target_next(target, held["feats"])
    train_next = target_next(target, train_data["feats"])
    # 3. the kept vocabulary: what the target predicts most often on the training blocks
    counts = torch.bincount(train_next[train_data["mask"]], minlength=target.config.vocab_size)
    keep = counts.argsort(descending=True)[:args.keep].sort().values
    kept = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    kept[keep] = True
    coverage = float(kept[held_next[held["mask"]]].float().mean())
    print(f"3. kept {args.keep} tokens: they cover {coverage:.3f} of the held-out next tokens", flush=True)
    results, best = [], None
    settings = f"K{args.keep}_lr{args.lr}_ce{args.ce_weight}_b{args.batch}_m{args.minutes}_{data_file.stem}"
    for spec in args.candidates.split(","):
        frozen, trained = (int(x) for x in spec.split("+"))
        print(f"4. candidate frozen={frozen} trained={trained}", flush=True)
        draft = build_exit_draft(target, frozen, trained, keep)
        saved = work / f"candidate_f{frozen}_t{trained}_{settings}.pt"  # a rerun reuses a trained candidate
        if saved.is_file():
            state, row = torch.load(saved)
            draft.load_state_dict(state)
        else:
            before = agreement(draft, held_next, held["ids"], held["mask"])
            history = train(draft, (train_data["ids"], train_data["mask"], train_data["feats"]), args.minutes,
                            args.lr, args.ce_weight, args.batch, args.seed)
            row = dict(frozen=frozen, trained=trained, keep=args.keep, requests=args.requests,
                       agreement_untrained=round(before, 4),
                       agreement=round(agreement(draft, held_next, held["ids"], held["mask"]), 4),
                       steps=history[-1]["step"] if history else 0, minutes=args.minutes)
            torch.save((draft.state_dict(), row), saved)
        row["cost_ratio"] = round(cost_ratio(target, draft), 4)
        gain, gamma = max((expected_speedup(row["agreement"], g, row["cost_ratio"]), g) for g in range(1, 9))
        row.update(model_speedup=round(gain, 3), model_gamma=gamma)
        print(f"5. {row}", flush=True)
        results.append(row)
        if best is None or row["model_speedup"] > best[0]["model_speedup"]:
            best = (dict(row), draft)
    if args.final_minutes > 0:  # the winner trains on, with a fresh schedule
        row, draft = best
        print(f"6. the winner (frozen={row['frozen']}, trained={row['trained']}) trains {args.final_minutes} min more",
              flush=True)
        history = train(draft, (train_data["ids"], train_data["mask"], train_data["feats"]), args.final_minutes,
                        args.lr / 2, args.ce_weight, args.batch, args.seed + 1)
        row.update(agreement=round(agreement(draft, held_next, held["ids"], held["mask"]), 4),
                   cost_ratio=round(cost_ratio(target, draft), 4), minutes=args.minutes + args.final_minutes,
                   steps=row["steps"] + (history[-1]["step"] if history else 0))
        gain, gamma = max((expected_speedup(row["agreement"], g, row["cost_ratio"]), g) for g in range(1, 9))
        row.update(model_speedup=round(gain, 3), model_gamma=gamma)
        print(f"7. {row}", flush=True)
        best = (row, draft)
    row, draft = best
    extra = dict(chosen_by=f"the best expected speedup of a greedy chain at this machine's cost ratio, each "
                           f"candidate trained {args.minutes} min; the winner then {args.final_minutes} min more",
                 measured=row, candidates=results, kept_coverage=round(coverage, 4), final_minutes=args.final_minutes,
                 data=dict(block=BLOCK, corpus_tokens=args.corpus_tokens, requests=args.requests, kinds=list(kinds),
                           new_tokens=args.new_tokens, train_blocks=len(train_data["ids"]),
                           heldout_blocks=len(held["ids"]), train_tokens=int(train_data["mask"].sum()),
                           heldout_tokens=int(held["mask"].sum())),
                 training=dict(lr=args.lr, ce_weight=args.ce_weight, batch=args.batch, seed=args.seed))
    save_exit_draft(draft, args.out, target_name="smol", extra=extra)
    print(f"saved frozen={row['frozen']} trained={row['trained']} to {args.out}")


if __name__ == "__main__":
    main()

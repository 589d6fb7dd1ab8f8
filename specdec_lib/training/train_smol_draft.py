"""Train SmolLM2-135M-Instruct's draft on the CPU, choosing among exit drafts by measurement (`make smol-draft`).

    python -m specdec_lib.training.train_smol_draft --out data/models/smol-draft --minutes 6

What it does, each step cached under $SPECDEC_CACHE/smol-draft so a rerun resumes (and a run asking more requests
than a cached one answers only the new ones):
1. data (`data.chat_data`), never HumanEval (a test suite): blocks of 256 tokens from the standard-library
   corpus's training split (under SmolLM2's tokenizer), and the model's own greedy answers to chat requests of
   the benchmark's three kinds cut from training files (`chat_requests`): what the draft meets at decode time.
   Held out: the corpus's held-out files and answers to requests cut from them;
2. the target's final normed hidden state at every position of every block (float16): the features each
   candidate learns to match, and the target's next token (its argmax) for agreement;
3. the kept vocabulary: the K tokens the target predicts most often on the training blocks (FR-Spec, Zhao et
   al. 2025: a frequency-ranked subset), with their coverage of the held-out next tokens;
4. each candidate `ExitDraft(frozen, trained)` trained for `--minutes` (the same budget for all): smooth-L1
   between the draft's normed hidden state and the target's, plus `--ce-weight` x soft cross-entropy between the
   two distributions over the kept tokens (the target's read through the same head rows), AdamW, `loop.lr_at`
   (a 20-step ramp on a cosine over the steps the first steps' speed predicts); trained candidates are cached;
5. measured: held-out top-1 agreement a with the target (teacher-forced) and the cost ratio c (one draft forward
   / one target forward after a 256-token prefix, timed where it runs), ranked by the chain model E[tokens] /
   step cost at the best gamma (bench.costs.expected_speedup);
6. the winner trains `--final-minutes` more, is measured again and saved with every measurement in draft.json.

Left out: free-running agreement (teacher-forced only: the draft reads the target's text, as verification
guarantees up to the first rejection); one learning rate for all candidates; the kept set chosen once.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from ..models.exit_draft import build_exit_draft, save_exit_draft, trained_parameters
from ..models.smol import ensure_smol_dir
from .chat_requests import KINDS
from .data import BLOCK, chat_cache, chat_data, data_name, kept_tokens, target_next
from .loop import agreement_share, masked_smooth_l1, soft_cross_entropy, train_loop

CANDIDATES = ((0, 2), (2, 2), (4, 1))  # (frozen, trained): a small distilled draft, and two early exits


def draft_hidden(draft, ids, mask):
    return draft.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (b, T, d), normed


def losses(draft, ids, mask, feats, ce_weight: float):
    h = draft_hidden(draft, ids, mask)  # (b, T, d)
    target_h = feats.to(h.dtype)
    reg = masked_smooth_l1(h, target_h, mask)
    head = draft.lm_head
    q_log = F.log_softmax(head.subset_logits(h), -1)  # (b, T, K)
    p = F.softmax(head.subset_logits(target_h), -1)  # (b, T, K): the target's distribution over the kept tokens
    ce = soft_cross_entropy(q_log, p, mask)
    return reg + ce_weight * ce, reg.item(), ce.item()


@torch.no_grad()
def agreement(draft, next_ids, ids, mask, batch: int = 16) -> float:
    """Share of held-out positions where the draft's argmax equals the target's next token."""
    def pieces():
        for i in range(0, len(ids), batch):
            h = draft_hidden(draft, ids[i:i + batch], mask[i:i + batch])
            guess = draft.lm_head.ids[draft.lm_head.subset_logits(h).argmax(-1)]  # (b, T)
            yield guess, next_ids[i:i + batch], mask[i:i + batch]
    return agreement_share(pieces())


def train(draft, data, minutes: float, lr: float, ce_weight: float, batch: int, seed: int, log=print):
    """Train for `minutes`: a 20-step ramp on a cosine over the step count the first steps' speed predicts."""
    ids, mask, feats = data
    opt = torch.optim.AdamW(trained_parameters(draft), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)

    def loss_fn(step):
        pick = torch.randint(0, len(ids), (batch,), generator=gen)
        loss, reg, ce = losses(draft, ids[pick], mask[pick], feats[pick], ce_weight)
        return loss, dict(reg=reg, ce=ce)

    draft.train()
    history = train_loop(opt, loss_fn, lr, minutes=minutes, warmup=20, overlap=True, record_every=25,
                         on_record=lambda row: log(f"    step {row['step']} {row}"))
    draft.eval()
    return history


def cost_ratio(target, draft) -> float:
    """One draft forward over one target forward, each after a 256-token cached prefix, timed where it runs."""
    from ..mechanisms.budget.step_cost import forward_cost

    t = float(forward_cost(target, rows=[1], repeats=15)["median_ms"].iloc[0])
    d = float(forward_cost(draft, rows=[1], repeats=15)["median_ms"].iloc[0])
    return d / t


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
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="kinds of request (training/chat_requests.py), comma separated")
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
    work = chat_cache()
    data_file = work / data_name(args.corpus_tokens, args.requests, args.new_tokens, args.seed, kinds)
    train_data, held = data["splits"]["train"], data["splits"]["heldout"]
    held_next = target_next(target, held["feats"])
    train_next = target_next(target, train_data["feats"])
    # 3. the kept vocabulary: what the target predicts most often on the training blocks
    keep = kept_tokens(train_next, train_data["mask"], target.config.vocab_size, args.keep)
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

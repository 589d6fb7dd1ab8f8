"""Re-distil the shipped draft from the shipped target, on whatever machine is at hand (a long CPU job).

    python -m specdec_lib.training.distill_draft --out /tmp/draft --init target --layers 0 --minutes 90 \\
        --log /tmp/draft/progress.jsonl          # the best draft in /tmp/draft; copy it to data/models/draft

Why: notebook 00's speedup model says what a bigger draft may cost: expected tokens per target-forward time =
(1 - a^(g+1)) / ((1 - a)(g c + 1)) for per-token acceptance a, draft length g and draft/target cost ratio c. On
a CPU every decoder layer of the target's own width raises c, so such a draft must agree with the target more
often just to break even with the shipped one (data/results/distill_draft.md has the measured ratios, the
break-even points and the runs).

So the default here builds the draft from the target itself (`--init target`): the target's embeddings (tied
with its output head), final norm and the decoder layers named by `--layers` (default: the first), then distils
it as `train_tiny` does (`loop.lm_loss`: 0.2 x cross-entropy + 0.8 x KL(p || q), p the target's next-token
distribution, q the draft's). Starting from the target's own embedding, layer and head, the draft starts in the
target's space. `--init shipped` continues the shipped draft. `--device auto` uses CUDA when present (float32:
the models are tiny).

Progress (held-out agreement, losses, speed) goes as JSON lines to `--log` every `--eval-every` steps, and the
best draft so far (by agreement) is saved to `--out` each time, so the job can be stopped at any point.

Left out: the teacher runs live (no cached logits); a fixed cosine schedule over `--steps` (`loop.lr_at`: warm-up
of min(100, steps / 10) steps, 5 % floor) that `--minutes` may cut short; agreement measured on the first
`--eval-tokens` held-out tokens only while training (the full split at the end).
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from ..corpus import load_corpus
from ..env import resolve_device
from .loop import encode_split, heldout_metrics, lm_loss, random_blocks, train_loop

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


def draft_from_target(target, layers: list[int]):
    """A Llama with the target's width, embeddings, final norm and the chosen decoder layers (copied)."""
    from transformers import LlamaForCausalLM

    if not layers or any(not 0 <= i < target.config.num_hidden_layers for i in layers):
        raise ValueError(f"--layers must name target layers 0..{target.config.num_hidden_layers - 1}, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    config.layer_types = None if getattr(config, "layer_types", None) is None else config.layer_types[:len(layers)]
    draft = LlamaForCausalLM(config)
    source = target.state_dict()
    state = {}
    for name in draft.state_dict():
        if name.startswith("model.layers."):
            index = int(name.split(".")[2])
            name_in_target = name.replace(f"model.layers.{index}.", f"model.layers.{layers[index]}.", 1)
            state[name] = source[name_in_target].clone()
        else:
            state[name] = source[name].clone()
    draft.load_state_dict(state)
    return draft


def distill(target, draft, train, held, *, steps: int, batch: int, block: int, lr: float, distill_weight: float,
            eval_every: int, eval_tokens: int, out: Path, log: Path | None, tokenizer, seed: int = 0,
            minutes: float | None = None) -> dict:
    """Distil draft toward target; save the best draft (by held-out agreement) to out; return the best record."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    device = next(draft.parameters()).device
    best = {"agreement": -1.0}
    started = time.time()

    def evaluate(step: int):
        nonlocal best
        draft.eval()
        metrics = heldout_metrics(target, draft, held, block, device, max_tokens=eval_tokens)
        draft.train()
        record = {"step": step, "minutes": round((time.time() - started) / 60, 2),
                  "agreement": round(metrics["agreement"], 4), "draft_loss": round(metrics["draft_loss"], 4),
                  "draft_acc": round(metrics["draft_acc"], 4), "lr": opt.param_groups[0]["lr"]}
        if record["agreement"] > best["agreement"]:
            best = record
            draft.save_pretrained(out)
            tokenizer.save_pretrained(out)
        record["best_step"] = best["step"]
        print(json.dumps(record), flush=True)
        if log is not None:
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\n")

    def loss_fn(step):
        tokens = random_blocks(train, batch, block, gen).to(device)
        return lm_loss(draft, tokens[:, :-1], tokens[:, 1:], target, distill_weight), {}  # float32 (tiny models)

    def after_step(done: int) -> bool:
        time_up = minutes is not None and time.time() - started > minutes * 60
        if done % eval_every == 0 or done == steps or time_up:
            evaluate(done)
        return time_up

    evaluate(0)
    draft.train()
    train_loop(opt, loss_fn, lr, steps=steps, warmup=min(100, steps // 10), floor=0.05, after_step=after_step)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS), help="folder with target/ (the teacher)")
    parser.add_argument("--out", required=True, help="where the best draft is saved")
    parser.add_argument("--init", choices=["target", "shipped"], default="target")
    parser.add_argument("--layers", default="0", help="with --init target: target layers to copy, e.g. 0 or 0,1")
    parser.add_argument("--steps", type=int, default=4000, help="length of the cosine schedule")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long (best draft kept)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--distill-weight", type=float, default=0.8)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-tokens", type=int, default=30000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default=None, help="JSON lines of progress")
    parser.add_argument("--corpus-dir", default=None)
    parser.add_argument("--max-files", type=int, default=None, help="first files of each split only (tests)")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    models = Path(args.models)
    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    target = AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()
    target.requires_grad_(False)
    if args.init == "target":
        draft = draft_from_target(target, [int(i) for i in args.layers.split(",")])
    else:
        draft = AutoModelForCausalLM.from_pretrained(models / "draft", dtype=torch.float32)
    corpus = load_corpus(Path(args.corpus_dir) if args.corpus_dir else models / "_corpus", max_files=args.max_files)
    train = encode_split(tokenizer, corpus["train"]["text"])
    held = encode_split(tokenizer, corpus["heldout"]["text"])
    device = resolve_device(args.device)
    target, draft = target.to(device), draft.to(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Path(args.log) if args.log else None
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "log", "models", "corpus_dir", "max_files")}
    settings["device"] = str(device)
    if log is not None:
        with open(log, "a") as f:
            f.write(json.dumps({"settings": settings, "torch": torch.__version__,
                                "threads": torch.get_num_threads()}) + "\n")
    started = time.time()
    best = distill(target, draft, train, held, steps=args.steps, batch=args.batch, block=args.block, lr=args.lr,
                   distill_weight=args.distill_weight, eval_every=args.eval_every, eval_tokens=args.eval_tokens,
                   out=out, log=log, tokenizer=tokenizer, seed=args.seed, minutes=args.minutes)
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    full = heldout_metrics(target, saved, held, args.block, device)
    summary = {"best": best, "heldout": full, "minutes": round((time.time() - started) / 60, 2),
               "settings": settings, "params": sum(p.numel() for p in saved.parameters())}
    (out / "distill.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary["heldout"]), flush=True)


if __name__ == "__main__":
    main()

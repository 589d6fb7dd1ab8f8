"""The training script end to end in quick mode: corpus through datasets, tokenizer, both models, reload."""
from __future__ import annotations

import json

import torch

from specdec_lib import generate, load_models
from specdec_lib.corpus import is_heldout, load_corpus
from specdec_lib.training.train_tiny import main


def test_corpus_split_is_whole_files_and_disjoint(tmp_path):
    corpus = load_corpus(tmp_path, max_files=5)
    assert set(corpus) == {"train", "heldout"}
    assert all(is_heldout(p) for p in corpus["heldout"]["path"])
    assert not any(is_heldout(p) for p in corpus["train"]["path"])
    assert len(corpus["train"]) == 5 and all(t.strip() for t in corpus["train"]["text"])


def test_quick_training_run(tmp_path, capsys):
    main(["--quick", "--out", str(tmp_path), "--seed", "3"])
    info = json.loads((tmp_path / "training.json").read_text())
    assert info["profile"] == "quick" and info["heldout"]["tokens"] > 0
    assert 0.0 <= info["heldout"]["agreement"] <= 1.0
    pair = load_models((tmp_path / "target", tmp_path / "draft"), device="cpu")
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.num_hidden_layers == 1
    assert pair.tokenizer.eos_token == "<|endoftext|>" and len(pair.tokenizer) == pair.target.config.vocab_size
    ids = pair.encode("import os\n")
    result = generate("autoregressive", pair.target, ids, 5)
    assert result.new_tokens == generate("hf", pair.target, ids, 5).new_tokens
    assert "train target" in capsys.readouterr().err  # tqdm progress is shown
    # Seeded: the same settings give the same weights.
    main(["--quick", "--out", str(tmp_path / "again"), "--seed", "3"])
    again = load_models((tmp_path / "again" / "target", tmp_path / "again" / "draft"), device="cpu")
    for a, b in zip(pair.target.parameters(), again.target.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_draft_from_target_copies_the_chosen_layers():
    import pytest

    from helpers import random_lm
    from specdec_lib.training.distill_draft import draft_from_target

    target = random_lm(layers=3).float()
    draft = draft_from_target(target, [2])
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == target.config.hidden_size
    for name, value in draft.state_dict().items():
        source = name.replace("model.layers.0.", "model.layers.2.", 1)
        torch.testing.assert_close(value, target.state_dict()[source], rtol=0, atol=0)
    with pytest.raises(ValueError, match="layers"):
        draft_from_target(target, [3])


def test_distill_draft_quick_run(tmp_path):
    from specdec_lib.training import distill_draft

    main(["--quick", "--out", str(tmp_path), "--seed", "1"])
    out, log = tmp_path / "redistilled", tmp_path / "progress.jsonl"
    distill_draft.main(["--models", str(tmp_path), "--out", str(out), "--steps", "4", "--batch", "2", "--block",
                        "32", "--eval-every", "2", "--eval-tokens", "200", "--log", str(log), "--max-files", "8",
                        "--corpus-dir", str(tmp_path / "_corpus")])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["settings"]["init"] == "target"
    assert [r["step"] for r in records[1:]] == [0, 2, 4]
    assert all(0.0 <= r["agreement"] <= 1.0 for r in records[1:])
    summary = json.loads((out / "distill.json").read_text())
    assert summary["best"]["agreement"] == max(r["agreement"] for r in records[1:])  # the best one was kept
    pair = load_models((tmp_path / "target", out), device="cpu")
    assert pair.draft.config.num_hidden_layers == 1
    assert pair.draft.config.hidden_size == pair.target.config.hidden_size
    ids = pair.encode("import os\n")
    result = generate("draft_model", pair.target, ids, 6, draft=pair.draft)
    assert result.new_tokens == generate("hf", pair.target, ids, 6).new_tokens

"""Shared fixtures: the shipped tiny pair, and small random float64 models built in memory (Llama and Qwen2).

Random-init LMs are nearly uniform; tests that need peaked distributions scale the output layer."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Many tiny forwards: on a small shared CPU, thread hand-offs cost more than the arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pair():
    from specdec_lib import load_models

    return load_models("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_pair64(tiny_pair):
    import copy

    target = copy.deepcopy(tiny_pair.target).to(torch.float64)
    draft = copy.deepcopy(tiny_pair.draft).to(torch.float64)
    return target, draft, tiny_pair.tokenizer


# Two short code prompts for parity runs on the shipped pair.
SHIPPED_PROMPTS = ["import os\nimport sys\n\n\ndef main(argv):\n", "class Stack:\n    def __init__(self):\n"]


def repeating_prompt(length: int, seed: int, vocab: int = 97) -> torch.Tensor:
    """(1, length) random token ids whose first third comes back at the end, so lookups and tables hit."""
    g = torch.Generator().manual_seed(seed)
    chunk = torch.randint(0, vocab, (max(1, length // 3),), generator=g)
    return torch.cat([chunk, torch.randint(0, vocab, (length - 2 * len(chunk),), generator=g), chunk])[None]


def autoregressive_samples(target, ids, max_new_tokens: int, seeds=range(6)):
    """(sampling kwargs, "autoregressive" tokens) for seeded runs at two settings: a method that draws one seeded
    sample per emitted token from p (tables, prompt lookup) must reproduce these tokens exactly."""
    from specdec_lib import generate

    for seed in seeds:
        for temperature, top_k in ((1.0, None), (0.7, 5)):
            kwargs = dict(temperature=temperature, top_k=top_k, seed=seed)
            yield kwargs, generate("autoregressive", target, ids, max_new_tokens, **kwargs).new_tokens


def random_lm(kind: str = "llama", vocab: int = 97, layers: int = 2, hidden: int = 32, seed: int = 0,
              logit_scale: float = 1.0, context: int = 256):
    """A randomly initialised float64 causal LM (real HF class), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                  tie_word_embeddings=False)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(kind)
    model = model.to(torch.float64).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


def with_head(target, steps: int = 150):
    """`target` with an EAGLE head trained here on its own greedy text (random models ship none)."""
    from specdec_lib.eagle_head import attach_head
    from specdec_lib.tools.train_eagle import quick_head

    attach_head(target, quick_head(target, steps=steps, sequences=8, length=64))
    return target


def all_match_hf(table, column: str = "all_match_hf", key: str = "method") -> bool:
    """Every row but hf's reproduced hf's tokens, and hf's own rows are not compared with themselves (None)."""
    reference = table[key] == "hf"
    return bool(table.loc[~reference, column].astype(bool).all()) and bool(table.loc[reference, column].isna().all())


@pytest.fixture(scope="session")
def smoke_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode as `make workbook` does (executed .ipynb, standalone pages,
    figures, index.html): {"out": folder, "runs": {notebook name: NotebookRun}}. The notebook tests and the
    browser test both read it, so no notebook runs twice."""
    from specdec_lib.tools import run_notebooks

    out = tmp_path_factory.mktemp("workbook")
    jupyter_data = tmp_path_factory.mktemp("jupyter_data")  # the notebooks' trust signatures, not the user's
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(out / "cache"))  # tables built on demand stay in the test's folder
        mp.setenv("JUPYTER_DATA_DIR", str(jupyter_data))
        runs = run_notebooks.run_all(out, smoke=True, timeout=300, log=lambda *a, **k: None)
    return {"out": out, "runs": {run.name: run for run in runs}, "jupyter_data": jupyter_data}


@pytest.fixture(scope="session")
def smol_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode with MODELS = "smol" (the real pair: SmolLM2-135M-Instruct and
    its exit draft), as a user would run them with that one parameter changed."""
    from specdec_lib.tools import run_notebooks

    out = tmp_path_factory.mktemp("workbook_smol")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(out / "cache"))
        mp.setenv("JUPYTER_DATA_DIR", str(tmp_path_factory.mktemp("jupyter_data_smol")))
        runs = run_notebooks.run_all(out, smoke=True, timeout=600, log=lambda *a, **k: None,
                                     params={"MODELS": "smol"})
    return {"out": out, "runs": {run.name: run for run in runs}}


@pytest.fixture(scope="session", autouse=True)
def _project_cache_in_a_temp_folder(tmp_path_factory):
    """Cost curves and frozen tables the tests measure or build go to a folder of this test session, not to the
    user's ~/.cache/specdec_lib (a curve timed on a loaded machine would otherwise steer their auto budgets)."""
    import os

    if "SPECDEC_CACHE" in os.environ:  # the caller chose one
        yield
        return
    from specdec_lib.smol import models_root

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_MODELS", str(models_root()))  # models made here (smol's dequantised GGUF) are shared
        mp.setenv("SPECDEC_CACHE", str(tmp_path_factory.mktemp("specdec_cache")))
        yield

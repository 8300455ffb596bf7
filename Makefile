# `make report` runs the default experiments and builds the book; `make test` runs the test suite.
# Both create .venv and install what they need when it is missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A CPU build of torch (on disk on the project's machines). GPU users: use environment.yml, or
# `make TORCH_SPEC='torch>=2.4' ...` to let pip pick a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Local copies of the datasets (DIR/imdb/train.csv.gz ...): DDP_CORE_DATA_DIR, else ../shared/data when it
# exists, else the Hugging Face Hub.
export DDP_CORE_DATA_DIR := $(or $(DDP_CORE_DATA_DIR),$(abspath $(wildcard ../shared/data)))

# The experiment: notebooks/profiles/$(PROFILE).yml, once per world size, into results/$(EXPERIMENT).
PROFILE ?= default
EXPERIMENT ?= report
WORLD_SIZES ?= 1 2 4
# Runs per world size, each with its own seed (repeat k: seed + k - 1, folder n<N>-r<k>): the spread between
# them is the run-to-run noise that the report holds every difference against.
REPEATS ?= 3
RESULTS_DIR ?= results
# The reference results shipped in the repository (`make reference` makes them anew).
REFERENCE := reference/report
# The runs the book shows (book/results links there): yours once `make report` has written them,
# else the reference results, so that a fresh clone builds the book without training.
RESULTS ?= $(if $(wildcard $(RESULTS_DIR)/$(EXPERIMENT)/*/run.json),$(RESULTS_DIR)/$(EXPERIMENT),$(REFERENCE))
# The all-reduce benchmark behind the cost model (chapter "Predicting scaling"), one per world size > 1.
ALLREDUCE_ARGS ?=
MATHJAX := book/_static/mathjax/tex-chtml.js
TEX_PACKAGES := texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended latexmk tex-gyre

.PHONY: test report reference book pdf install

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed $(MATHJAX)
	$(BIN)/python -m pytest

# One papermill execution of the run notebook per world size, saved next to the run's CSVs. A run that
# fails leaves its partial notebook as run_experiment.failed.ipynb for inspection.
# n4/ is the first run at 4 ranks, n4-r2/ its second repeat.
$(RESULTS_DIR)/$(EXPERIMENT)/n%/run_experiment.ipynb: notebooks/run_experiment.md notebooks/profiles/$(PROFILE).yml | $(VENV)/.installed
	mkdir -p $(@D)
	$(BIN)/jupytext --to ipynb -o - $< | $(BIN)/papermill --no-progress-bar - $(@D)/run_experiment.failed.ipynb \
		-p profile $(PROFILE) -p world_size $(firstword $(subst -r, ,$*)) -p repeat $(or $(word 2,$(subst -r, ,$*)),1) \
		-p experiment $(EXPERIMENT) -p results_dir $(RESULTS_DIR)
	mv $(@D)/run_experiment.failed.ipynb $@

$(RESULTS_DIR)/$(EXPERIMENT)/allreduce-n%/allreduce.csv: | $(VENV)/.installed
	$(BIN)/torchrun --standalone --nproc-per-node $* -m ddp_core.bench.allreduce --out $(@D) $(ALLREDUCE_ARGS)

# Point book/results at a folder of runs and build the site from it.
build_book = ln -sfn $(abspath $(1)) book/results && $(BIN)/jupyter-book build book -W --keep-going

run_dirs = $(foreach n,$(WORLD_SIZES),n$(n) $(foreach k,$(wordlist 2,$(REPEATS),$(shell seq $(REPEATS))),n$(n)-r$(k)))

report: $(MATHJAX) $(foreach run,$(run_dirs),$(RESULTS_DIR)/$(EXPERIMENT)/$(run)/run_experiment.ipynb) \
		$(foreach n,$(filter-out 1,$(WORLD_SIZES)),$(RESULTS_DIR)/$(EXPERIMENT)/allreduce-n$(n)/allreduce.csv)
	$(BIN)/python -m ddp_core.report.scaling $(RESULTS_DIR)/$(EXPERIMENT)
	$(BIN)/python -m ddp_core.report.cost_model $(RESULTS_DIR)/$(EXPERIMENT)
	$(BIN)/python -m ddp_core.report.nvlink_forecast $(RESULTS_DIR)/$(EXPERIMENT)
	$(call build_book,$(RESULTS_DIR)/$(EXPERIMENT))
	@echo "HTML: _build/html/index.html"

# The reference results, made anew on this machine with the default profile: every run retrained, the
# checkpoints left out (the book needs none). Commit them with the code they were made with.
reference: | $(VENV)/.installed
	rm -rf $(REFERENCE)
	$(MAKE) report RESULTS_DIR=$(patsubst %/,%,$(dir $(REFERENCE))) EXPERIMENT=$(notdir $(REFERENCE)) PROFILE=default WORLD_SIZES="1 2 4" REPEATS=3
	find $(REFERENCE) -name checkpoint.pt -delete

book: $(VENV)/.installed $(MATHJAX)
	$(call build_book,$(RESULTS))
	@echo "HTML: _build/html/index.html"

pdf: $(VENV)/.installed
	command -v latexmk >/dev/null && kpsewhich tgtermes.sty >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends $(TEX_PACKAGES))
	ln -sfn $(abspath $(RESULTS)) book/results
	$(BIN)/jupyter-book build book --builder pdflatex
	@echo "PDF: _build/latex/book.pdf"

# MathJax served from the site itself, so that equations render without internet.
$(MATHJAX):
	npm install --no-save --no-audit --no-fund --prefix .npm mathjax@3.2.2
	mkdir -p $(@D)/output/chtml $(@D)/input/tex
	cp .npm/node_modules/mathjax/es5/tex-chtml.js $@
	cp -r .npm/node_modules/mathjax/es5/output/chtml/fonts $(@D)/output/chtml/
	cp -r .npm/node_modules/mathjax/es5/input/tex/extensions $(@D)/input/tex/
	cp -r .npm/node_modules/mathjax/es5/a11y .npm/node_modules/mathjax/es5/ui $(@D)/

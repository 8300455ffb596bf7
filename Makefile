# `make report` runs the default experiments and builds the book; `make test` runs the test suite (`make test-fast`
# the quick part of it).
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

# The studies: notebooks/studies.yml (what each varies, from which profile); STUDIES="a b" runs some of them.
# Each study's runs land in $(RESULTS_DIR)/<study>; a finished run is reused, an interrupted one resumed.
# PROFILE=gpu: the studies on another base profile (notebooks/profiles/$(PROFILE).yml) instead of each one's own,
# from the study list sized for GPUs (notebooks/studies-gpu.yml): the runner refuses a study whose settings would
# override the profile's.
PROFILE ?=
STUDY_LIST ?= $(if $(filter gpu,$(PROFILE)),notebooks/studies-gpu.yml,notebooks/studies.yml)
STUDIES ?=
RESULTS_DIR ?= results
# WORLD_SIZES="1": only the runs of that many ranks (a machine with one GPU); a later call trains the rest.
WORLD_SIZES ?=
# LAUNCHER=slurm: every run (and all-reduce benchmark) a job of slurm/ddp_train.sbatch, submitted from here and waited
# for in turn, round by round; RUNNER_ARGS="--ranks-per-node 8 --cpus-per-rank 8" places them (python -m
# ddp_core.studies.run --help).
LAUNCHER ?= local
RUNNER_ARGS ?=
# Options for the all-reduce benchmark behind the cost model (ddp_core/bench/allreduce.py).
ALLREDUCE_ARGS ?=
# The reference results shipped in the repository (`make reference` makes them anew). The book shows, for
# each study, the runs in $(RESULTS_DIR) when there are any and else these, so a fresh clone builds it
# without training.
REFERENCE := reference
export DDP_CORE_RESULTS_DIR := $(abspath $(RESULTS_DIR))
MATHJAX := book/_static/mathjax/tex-chtml.js
QUIET_KERNELS := _build/ipython/profile_default/ipython_kernel_config.py
TEX_PACKAGES := texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended latexmk tex-gyre
# apt-get waits for another install to finish (the tests install Slurm while a book test installs TeX) instead of
# failing at once on dpkg's lock.
APT_GET := apt-get -o DPkg::Lock::Timeout=600

.PHONY: test test-fast report reference single-device peers step-profile book pdf install tex prepare browser

# pip compiles each installed module to bytecode one file after another; compileall does it on every core, and
# leaves out the packages' own test suites, which nothing imports (exit code 1: torch ships a file for Python 3.12
# only, which pip leaves uncompiled too). Without the bytecode, every process would compile what it imports again
# where PYTHONDONTWRITEBYTECODE is set.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH_SPEC)" -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 -x '/tests?/' \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || test $$? -eq 1
	touch $@

install: $(VENV)/.installed

# ruff first (pyproject.toml says which rules): a line over 120 characters, an unused name or code `ruff format`
# would change fails in seconds.
test: $(VENV)/.installed $(MATHJAX) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

# The inner loop: every test but those that train more than a few steps, start a multi-process job or a notebook, or
# build a book (31 s on the project's 2-core machine).
test-fast: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not slow"

build_book = $(BIN)/jupyter-book build book -W --keep-going
# The study runner on the chosen studies ($(1)), the studies first: --world-sizes takes every number after it.
run_studies = $(BIN)/python -m ddp_core.studies.run $(1) --study-list $(STUDY_LIST) \
	--allreduce-args="$(ALLREDUCE_ARGS)" --launcher $(LAUNCHER) $(RUNNER_ARGS) $(if $(PROFILE),--profile $(PROFILE)) \
	$(if $(WORLD_SIZES),--world-sizes $(WORLD_SIZES))

# Train the studies (each run an executed run notebook in its folder), then build the book from them: a line
# per run or benchmark with its time, then the book's warnings only.
report: $(MATHJAX) | $(VENV)/.installed $(QUIET_KERNELS)
	$(call run_studies,$(STUDIES)) --results-dir $(RESULTS_DIR)
	@echo "building the book (make book shows Sphinx's progress)"
	@IPYTHONDIR=$(abspath $(dir $(QUIET_KERNELS))..) $(build_book) -q
	@echo "HTML: _build/html/index.html"

# The book's notebook kernels log only what is critical: the warning each one prints as it starts, once per page,
# would bury the progress lines of make report. A kernel reads this from the IPython profile that IPYTHONDIR names.
$(QUIET_KERNELS):
	@mkdir -p $(@D) && echo 'c.IPKernelApp.log_level = "CRITICAL"' > $@

# The reference results, made anew on this machine: every study retrained, the checkpoints left out (the
# book needs none). Commit them with the code they were made with. The measurements of single devices, of the
# peers and of a step's operators stay: they come from other machines too (make single-device, peers, step-profile);
# so do the quota period's (python benchmarks/cpu_period.py --results-dir reference/cpu_period) and a GPU lease's
# (benchmarks/gpu_session.sh: gpu_trainer, gpu_timeline, and gpu_lease with their provenance). Every run is checked
# first, against an empty folder: a bad setting stops it before anything is removed.
reference: | $(VENV)/.installed
	$(call run_studies,) --check --results-dir "$$(mktemp -u -d)"
	mkdir -p $(REFERENCE) && find $(REFERENCE) -mindepth 1 -maxdepth 1 ! -name single_device ! -name peers \
		! -name step_profile ! -name cpu_period ! -name gpu_trainer ! -name gpu_timeline ! -name gpu_lease \
		-exec rm -rf {} +
	$(MAKE) report RESULTS_DIR=$(REFERENCE) STUDIES=
	cp _build/headline.png $(REFERENCE)/headline.png
	find $(REFERENCE) -name checkpoint.pt -delete

# Training throughput, MFU and the overheads of ddp_core and of DDP on this machine's device (a GPU if there
# is one), into $(RESULTS_DIR)/single_device/<device>; `make single-device RESULTS_DIR=reference` adds it to the
# reference results. SINGLE_DEVICE_ARGS: presets, batch sizes, precisions (benchmarks/single_device.py --help).
SINGLE_DEVICE_ARGS ?= --presets small --batch-sizes 8 32 --amp off bf16
single-device: | $(VENV)/.installed
	$(BIN)/python benchmarks/single_device.py --results-dir $(RESULTS_DIR) $(SINGLE_DEVICE_ARGS)

# ddp_core against the loop of PyTorch's DDP tutorial and an Accelerate loop, interleaved, at 1 and 2 ranks, into
# $(RESULTS_DIR)/peers/<device> (about 18 minutes on 2 cores); PEERS_ARGS: python -m benchmarks.peers --help.
peers: | $(VENV)/.installed
	$(BIN)/python -m benchmarks.peers --results-dir $(RESULTS_DIR) $(PEERS_ARGS)

# Where a training step's time goes, operator by operator (torch.profiler), into $(RESULTS_DIR)/step_profile/<device>.
step-profile: | $(VENV)/.installed
	$(BIN)/python -m benchmarks.step_profile --results-dir $(RESULTS_DIR)

book: $(VENV)/.installed $(MATHJAX)
	$(build_book)
	@echo "HTML: _build/html/index.html"

# TeX: installed with apt-get where it is missing and make runs as root; without root, a TeX of the user's own (see
# docs/using.md, "On a GPU cluster") on the PATH.
pdf: $(VENV)/.installed tex
	$(BIN)/jupyter-book build book --builder pdflatex
	@echo "PDF: _build/latex/book.pdf"

tex:
	@command -v latexmk >/dev/null && kpsewhich tgtermes.sty >/dev/null || [ "$$(id -u)" = 0 ] || \
		{ echo "make pdf: needs latexmk and TeX Gyre (tgtermes.sty) on the PATH, which only root can install with" \
		       "apt-get; see docs/using.md, \"On a GPU cluster\"" >&2; exit 2; }
	@command -v latexmk >/dev/null && kpsewhich tgtermes.sty >/dev/null || \
		($(APT_GET) update -qq && $(APT_GET) install -y -qq --no-install-recommends $(TEX_PACKAGES))

# Headless Chromium, in which the tests open the forecast page: installed with apt-get where it is missing and make
# runs as root; elsewhere that test is skipped, and says why.
browser:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || \
		($(APT_GET) update -qq && $(APT_GET) install -y -qq --no-install-recommends chromium)

# What needs the internet, once, on a machine that has it (a cluster's login node): the venv, MathJax and, as root,
# TeX. Afterwards `make report` and `make pdf` need no network (the datasets as files: docs/using.md).
prepare: $(VENV)/.installed $(MATHJAX) tex

# MathJax served from the site itself, so that equations render without internet.
$(MATHJAX):
	npm install --no-save --no-audit --no-fund --prefix .npm mathjax@3.2.2
	mkdir -p $(@D)/output/chtml $(@D)/input/tex
	cp .npm/node_modules/mathjax/es5/tex-chtml.js $@
	cp -r .npm/node_modules/mathjax/es5/output/chtml/fonts $(@D)/output/chtml/
	cp -r .npm/node_modules/mathjax/es5/input/tex/extensions $(@D)/input/tex/
	cp -r .npm/node_modules/mathjax/es5/a11y .npm/node_modules/mathjax/es5/ui $(@D)/

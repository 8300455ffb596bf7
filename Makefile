# `make report` runs the default experiment set; `make test` runs the test suite.
# Both create .venv and install what they need when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU build of torch (on disk on the project's machines). GPU users: use environment.yml, or
# `make TORCH_SPEC='torch>=2.4' ...` to let pip pick a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Local copies of the datasets (DIR/imdb/train.csv.gz ...): DDP_CORE_DATA_DIR, else ../shared/data when it
# exists, else the Hugging Face Hub.
export DDP_CORE_DATA_DIR := $(or $(DDP_CORE_DATA_DIR),$(abspath $(wildcard ../shared/data)))

# The default experiment: IMDB, small preset, sized to finish in a few minutes on a 2-core CPU.
EXPERIMENT ?= results/report
WORLD_SIZES ?= 1 2 4
TRAIN_ARGS ?= --dataset imdb --preset small --train-samples 2000 --eval-samples 1000 --seq-len 128 \
	--global-batch-size 32 --epochs 3 --lr 3e-3 --warmup-steps 30 --seed 0

.PHONY: test report install clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest

$(EXPERIMENT)/n%/metrics.csv: | $(VENV)/.installed
	$(PY) -m ddp_core.train $(TRAIN_ARGS) --check
	$(VENV)/bin/torchrun --standalone --nproc-per-node $* -m ddp_core.train $(TRAIN_ARGS) --out $(EXPERIMENT)/n$*

report: $(foreach n,$(WORLD_SIZES),$(EXPERIMENT)/n$(n)/metrics.csv)
	$(PY) -m ddp_core.analysis $(EXPERIMENT)

clean-venv:
	rm -rf $(VENV)

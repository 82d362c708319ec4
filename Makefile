# The two commands of the README:
#   make demo   set up, then p3kv against MXNet's dist_sync on an emulated 4-host cluster with 400 Mbit links
#               (network namespaces: needs root, uses sudo otherwise), 3 interleaved repeats each, SGD on, in
#               about 7 minutes; ends with each system's throughput and the ratio with 95% CIs; writes only build/demo/
#   make test   set up (Horovod included), then lint and run the test suite (what CI runs)
# and the fast tier of the tests alone (pure Python and the C++ unit tests, no jobs):
#   make test-unit
# and the sanitizer tier alone (the C++ tests under ASan+UBSan and TSan, jobs with an ASan-built extension):
#   make test-sanitizer
# Benchmarks on this machine's loopback (no root):
#   make bench-kvstore   like-for-like kvstore benchmark: p3kv (with and without its server-side SGD), MXNet
#                        dist_sync, MXNet's P3 and Horovod, same optimizer, through MXNet's engine
#                        (results/kvstore_bench.{md,csv}); runs bench-setup first (Horovod)
#   make bench-server    the server's CPU per slice (aggregate + update) against a memcpy floor, no network
#                        (results/server_slice.{md,csv})
#   make bench-startup   a job's first step and CPU, servers importing mxnet at start-up or not (P3_PRELOAD_MXNET)
#                        (results/startup.{md,csv})
# On the emulated cluster (root): make sweeps (the paper's evaluation), make bench-accuracy (its accuracy claim).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.p3kv-installed
CORE := $(shell find cpp -name '*.cc' -o -name '*.h') setup.py pyproject.toml

# Network namespaces need root: run the cluster benchmarks through sudo unless we are root already.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo -E)

.PHONY: setup system-deps test test-unit test-sanitizer demo demo-full bench bench-setup bench-kvstore bench-accuracy \
	bench-transport bench-server bench-startup sweeps sweep-slice \
	sweeps-estimate bench-report sim lint clean

setup: system-deps $(STAMP)

# The system packages (g++, libssl-dev, python3-venv, iproute2, openssh-server): installed when missing, as root
# or through sudo (scripts/system-deps.sh), so that `make test` works on a fresh Debian machine.
system-deps:
	@bash scripts/system-deps.sh

# Sockeye 2.3.24 (the last MXNet Sockeye) pins mxnet 1.8 and gluoncv 0.10.5 pulls opencv and a newer numpy, yet
# both run on mxnet 1.9.1 with numpy<1.24: they are installed without their dependencies (the `sockeye` and
# `bench` extras list the ones they need).
$(STAMP): $(CORE) | system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,sockeye,bench,deploy]'
	$(PY) -m pip install -q --no-deps sockeye==2.3.24 gluoncv==0.10.5.post0
	touch $@

lint: setup
	$(VENV)/bin/ruff check p3kv tests benchmarks examples deploy

# bench-setup first: Horovod (the allreduce baseline) is in the launcher's and the benchmarks' tests.
test: lint bench-setup
	$(PY) -m pytest -q --durations=25 tests

# One tier of tests/ (`pytest -m unit`; the tiers are in pyproject.toml and tests/README.md).
test-unit: setup
	$(PY) -m pytest -q -m unit tests

# Part of `make test`; alone: build/cpp-tests/ keeps the sanitized builds, so a second run compiles nothing.
test-sanitizer: setup
	$(PY) -m pytest -q -m sanitizer tests

# ResNet-50, P100 compute at its published speed slowed 10x on 400 Mbit links: P100s on 4 Gbit links (the paper's
# ResNet-50 point), each host at 4 dilated CPUs and each thread at one. 6 jobs of 2 warm-up + 6 timed iterations,
# about 7 minutes; the run guard waits at most 60 s in all for an idle machine, then proceeds with a warning
# recorded in the rows. DEMO_SYSTEMS="p3 dist_sync mxnet-p3 horovod" adds MXNet's P3 and Horovod (Horovod
# only when installed: `make bench-setup` builds it; the demo never does); DEMO_FLAGS passes options (--repeats,
# --iters, --strict, ...: python -m benchmarks.suites.demo --help). Everything goes to build/demo/.
DEMO_SYSTEMS ?= p3 dist_sync
DEMO_FLAGS ?=
demo: setup
	$(SUDO) $(PY) -m benchmarks.suites.demo --systems $(DEMO_SYSTEMS) $(DEMO_FLAGS)

# The full comparison (the sweeps' demo): all four systems, 3 shuffled repeats of 2 warm-up + 20 timed iterations,
# 12 jobs: 7 min 48 s on an idle 2-core machine after set-up (`python -m benchmarks` estimates 8 min); appends to
# benchmarks/results/sweeps/demo.csv and rewrites docs/benchmarks.md's tables, under the strict idle gate (it refuses a busy
# machine or a dirty tree: DEMO_FULL_FLAGS=--force / --allow-dirty override, recorded in every row).
DEMO_FULL_FLAGS ?=
demo-full: bench-setup
	$(SUDO) $(PY) -m benchmarks.suites.sweeps demo $(DEMO_FULL_FLAGS)
	$(PY) -m benchmarks.report

# Every sweep of the paper's evaluation with the reviewed settings (optimizer on, 3 shuffled repeats of 2 warm-up +
# 20 timed iterations, all four systems), then docs/benchmarks.md's tables: an estimated 19.8 hours on an idle 2-core
# machine in full (`make sweeps-estimate` gives each sweep's time, in full and for what is not measured yet). Each sweep is also its own command (python -m benchmarks.suites.sweeps NAME);
# SWEEP_FLAGS passes options to every one (e.g. --force, --repeats 5). With --resume (the default here) a sweep
# runs only what its CSV in benchmarks/results/sweeps/ lacks, so an interrupted `make sweeps` continues where it
# stopped; to measure everything again, move benchmarks/results/sweeps/ aside first.
SWEEPS := demo bandwidth slice ablation scale sensitivity dilation utilisation shallow cubic
SWEEP_FLAGS ?= --resume
sweeps: bench-setup
	for s in $(SWEEPS); do $(SUDO) $(PY) -m benchmarks.suites.sweeps $$s $(SWEEP_FLAGS) || exit 1; done
	$(PY) -m benchmarks.report

# One part of a long sweep, sized for one idle window: `make sweeps-estimate` prints each sweep's N parts of at
# most 2 hours; e.g. make sweep-slice SWEEP=bandwidth SLICE=2/6 (--resume: a part interrupted continues).
SWEEP ?= bandwidth
SLICE ?= 1/1
sweep-slice: bench-setup
	$(SUDO) $(PY) -m benchmarks.suites.sweeps $(SWEEP) --resume --slice $(SLICE) $(filter-out --resume,$(SWEEP_FLAGS))
	$(PY) -m benchmarks.report

# The paper's accuracy claim in miniature (p3kv vs dist_sync vs dist_async on scikit-learn's digits, 4 emulated
# hosts on 100 Mbit links, 3 shuffled repeats; 25 minutes here): results/accuracy/accuracy.{csv,md,png}.
ACCURACY := benchmarks/results/accuracy
bench-accuracy: setup
	$(SUDO) $(PY) -m benchmarks.suites.accuracy --hosts 4 --bandwidth 100mbit --iters 150 --compute-s 0.3 --repeats 3 \
		--targets 0.8 0.9 0.95 --csv $(ACCURACY)/accuracy.csv --plot $(ACCURACY)/accuracy.png \
		--summary $(ACCURACY)/accuracy.md
	$(PY) -m benchmarks.report

sweeps-estimate: setup
	$(PY) -m benchmarks.suites.sweeps estimate

# The README's benchmark tables and sentences from the result CSVs (make test checks they are current).
bench-report: setup
	$(PY) -m benchmarks.report

bench: sweeps

# Horovod 0.28.1 with MXNet and Gloo (no MPI), the allreduce baseline of bench-kvstore; about 2 minutes on 2 cores.
# Its bundled Gloo fails with CMake 4, so the build uses the system's CMake 3 (Debian's `cmake`, installed here
# when we are root) through HOROVOD_CMAKE, whatever cmake comes first on PATH.
HOROVOD_CMAKE ?= /usr/bin/cmake
HOROVOD_BUILD := HOROVOD_CMAKE=$(HOROVOD_CMAKE) HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1
bench-setup: setup
	@if ! test -x $(HOROVOD_CMAKE); then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q cmake; \
		else echo "bench-setup: no $(HOROVOD_CMAKE); install CMake 3 (apt-get install cmake) or set HOROVOD_CMAKE"; exit 1; fi; \
	fi
	@$(HOROVOD_CMAKE) --version | grep -q 'version 3\.' || \
		{ echo "bench-setup: $(HOROVOD_CMAKE) is not CMake 3 (Horovod's Gloo needs it): set HOROVOD_CMAKE"; exit 1; }
	$(PY) -m pip install -q setuptools wheel pyyaml packaging cloudpickle psutil
	$(HOROVOD_BUILD) $(PY) -m pip install -q --no-build-isolation horovod==0.28.1
	$(PY) -c 'import horovod.mxnet as h; assert h.gloo_built(), "horovod was built without Gloo"'

# Like-for-like: every system pushes ResNet-50's and VGG-19's arrays through MXNet's engine and runs the same
# SGD (2 workers + 2 servers, Horovod 2 workers). Refuses to start on a busy machine (see --max-load, --force).
bench-kvstore: bench-setup
	$(PY) -m benchmarks.suites.kvstore_bench --models resnet50_v1 vgg19 --repeats 3 --warmup 3 --iters 20
	$(PY) -m benchmarks.report

# Transport only, on loopback (no namespaces, no root): p3kv's raw numpy P3Worker (no MXNet engine, no optimizer)
# against MXNet's kvstores through the engine; not like-for-like, see bench-kvstore for that.
bench-transport: setup
	$(PY) -m benchmarks.suites.transport_bench --models resnet50_v1 vgg19 --kvstores p3 dist_sync mxnet-p3 --iters 10 --repeats 2

# Server hot path (issue "Server hot path"): C++ only, one thread, about a minute on 2 cores; needs g++, not MXNet.
bench-server: setup
	$(PY) -m benchmarks.suites.server_bench --repeats 5

bench-startup: setup
	$(PY) -m benchmarks.suites.startup_bench --repeats 5

clean:
	rm -rf build *.egg-info p3kv/_p3*.so $(VENV)

# The simulator (benchmarks/sim): fit CPU costs on the loopback benchmarks and the emulated links' CPU on the fit
# split (kept in results/sim_fit.json until their inputs change), validate on the held-out points, then the
# paper's evaluation at paper scale and past it (pure Python, no root).
sim: setup
	$(PY) -m benchmarks.sim.run all

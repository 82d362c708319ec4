#!/usr/bin/env bash
# The GPU check of p3kv.torch's CUDA path, in one go, for a lent accelerator (torch with CUDA, no MXNet, maybe no
# package registry): says what the machine lacks, builds the C++ extension in place with the system compiler,
# then runs tests/gpu/gpu_check.py (jobs on the GPU compared with DDP and with CPU runs, and a timing line).
#
#   tests/gpu/run_gpu_check.sh                 # on the GPU
#   tests/gpu/run_gpu_check.sh --device cpu    # the dry run on any machine (CPU double of the side stream)
#   tests/gpu/run_gpu_check.sh --bench [ARGS]  # the same build, then benchmarks/suites/gpu_bench.py ARGS instead
#                                              # (a real network on the GPU: p3kv, DDP, nothing; gpu_bench.csv/.md)
#
# P3_TREE_MANIFEST=build/tree-manifest (written here by python -m benchmarks.emulation.tree_manifest, carried):
# the first line names the commit the copied tree is.
# Results: $OUT/gpu_check.csv and $OUT/gpu_check.log ($OUT: what the device tool copies back; default
# build/gpu-check). Exit 0 when every check passed. Not run by pytest/CI (tests/conftest.py, tests/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEVICE=cuda
MODE=check
BENCH_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE=${2:?--device cuda|cpu}; shift 2 ;;
    --bench) MODE=bench; shift; BENCH_ARGS=("$@"); break ;;
    *) echo "unknown argument $1 (--device cuda|cpu, --bench [gpu_bench.py's arguments])"; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
OUTDIR=${OUT:-build/gpu-check}
mkdir -p "$OUTDIR" || exit 2
exec > >(tee "$OUTDIR/gpu_$MODE.log") 2>&1
START=$(date +%s)
# The commit: from a carried tree manifest where there is one (the device's .git lags the copied tree), checked.
if [[ -n "${P3_TREE_MANIFEST:-}" ]]; then
  COMMIT=$("$PY" -c "import pathlib, sys; from benchmarks.emulation import tree_manifest as t; from benchmarks.emulation.run_guard import OUTPUTS; c, d = t.check(pathlib.Path(sys.argv[1]), pathlib.Path('.'), OUTPUTS); print(c[:12] + (f' with {len(d)} files changed' if d else ''))" "$P3_TREE_MANIFEST" 2>&1)
else
  COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo 'no git') (the .git here may lag the tree: P3_TREE_MANIFEST)"
fi
echo "== p3kv GPU $MODE ($DEVICE), $(date -u +%FT%TZ), $COMMIT"

echo "== what is here"
missing=0
"$PY" - "$DEVICE" <<'PYEOF' || missing=1
import importlib, sys
need = {"numpy": "the core's arrays", "pybind11": "the extension's bindings (its headers)",
        "torch": "p3kv.torch"}
bad = []
for name, why in need.items():
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except ImportError as e:
        bad.append(f"{name} ({why}): {e}")
try:
    import setuptools
    print(f"  setuptools {setuptools.__version__}")
except ImportError:
    print("  setuptools not importable: the extension is built with the compiler directly")
print(f"  python {sys.version.split()[0]}")
try:
    import torch
    cuda = torch.cuda.is_available()
    print(f"  torch CUDA {torch.version.cuda}, available: {cuda}" +
          (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else ""))
    if sys.argv[1] == "cuda" and not cuda:
        bad.append("a CUDA device (torch.cuda.is_available() is False); --device cpu runs the dry run")
except ImportError:
    pass
try:
    import mxnet  # noqa: F401
    print("  mxnet importable (not needed)")
except ImportError:
    print("  mxnet not importable (not needed: the servers are p3kv.core.server)")
for b in bad:
    print(f"MISSING: {b}")
sys.exit(1 if bad else 0)
PYEOF
CXX_BIN=${CXX:-g++}
if ! command -v "$CXX_BIN" >/dev/null; then echo "MISSING: a C++17 compiler ($CXX_BIN)"; missing=1; fi
if ! echo '#include <openssl/hmac.h>' | "$CXX_BIN" -x c++ -fsyntax-only - 2>/dev/null; then
  echo "MISSING: OpenSSL's headers (openssl/hmac.h; Debian: libssl-dev): the core's handshake uses HMAC"; missing=1
fi
if ! echo 'int main(){}' | "$CXX_BIN" -x c++ - -lcrypto -o "$OUTDIR/.link-test" 2>/dev/null; then
  echo "MISSING: libcrypto to link (-lcrypto; Debian: libssl-dev)"; missing=1
fi
rm -f "$OUTDIR/.link-test"
if [[ $missing != 0 ]]; then echo "== stopped: install what is MISSING above"; exit 3; fi

# Without setuptools: what setup.py does (same sources, flags and libraries), one compiler per source in parallel.
build_direct() {
  local objs=build/gpu-check-objs inc suffix
  inc=$("$PY" -c "import pybind11, sysconfig; print(pybind11.get_include(), sysconfig.get_paths()['include'])")
  suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  mkdir -p "$objs"
  local flags=(-std=c++17 -O3 -Wall -Wextra -fPIC -fvisibility=hidden -DNDEBUG -Icpp/include -Icpp/mxnet -Icpp/python)
  for d in $inc; do flags+=("-I$d"); done
  ls cpp/src/*.cc cpp/mxnet/*.cc cpp/python/*.cc | xargs -P "$(nproc)" -I{} sh -c \
    "$CXX_BIN ${flags[*]} -c {} -o $objs/\$(echo {} | tr / _).o" || return 1
  "$CXX_BIN" -shared "$objs"/*.o -ldl -lcrypto -pthread -o "p3kv/_p3$suffix"
}

echo "== build"
B0=$(date +%s)
if "$PY" -c "import setuptools" 2>/dev/null; then
  echo "  setup.py build_ext --inplace"
  NPY_NUM_BUILD_JOBS=$(nproc) "$PY" setup.py build_ext --inplace -q >"$OUTDIR/build.log" 2>&1
else
  echo "  the compiler directly (no setuptools)"
  build_direct >"$OUTDIR/build.log" 2>&1
fi
if [[ $? != 0 ]]; then
  tail -40 "$OUTDIR/build.log"; echo "== build failed (whole log: $OUTDIR/build.log)"; exit 4
fi
echo "  built in $(( $(date +%s) - B0 )) s"
"$PY" -c "import p3kv._p3, p3kv.torch; print('  p3kv imports')" || exit 4

echo "== jobs"
if [[ $MODE == bench ]]; then
  "$PY" -m benchmarks.suites.gpu_bench --device "$DEVICE" --out "$OUTDIR" "${BENCH_ARGS[@]}"
else
  "$PY" tests/gpu/gpu_check.py --device "$DEVICE" --out "$OUTDIR"
fi
rc=$?
echo "== done in $(( $(date +%s) - START )) s, exit $rc"
exit $rc

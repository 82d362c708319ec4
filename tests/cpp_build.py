"""Builds the C++ unit test programs (cpp/tests/NAME_tests.cc, each with its own main) once per change of the C++
code, not once per test run.

Every cpp/src/*.cc is compiled warnings-clean (-Wall -Wextra -Werror) into one static library, and each test
program is linked against it (the linker takes only the objects a program uses), into build/cpp-tests/<key>/,
where the key hashes the C++ sources and headers, the flags and the compiler. A run that finds its key's files
reuses them without starting the compiler. Objects are kept under keys of their own (build/cpp-tests/objects/),
so after a change only the sources it touches are compiled again. Concurrent pytest processes take a file lock
around a build, and every file is written under a temporary name and renamed into place, so a killed build
leaves no half-written library or program behind. A new build removes all but the few newest old ones.

Sanitizer variants (the `sanitizer` test tier, tests/test_sanitizers.py): `variant="asan"` builds the same
library and programs with AddressSanitizer + UndefinedBehaviorSanitizer (any undefined behaviour fails), and
`variant="tsan"` with ThreadSanitizer, each under keys of its own (build/cpp-tests/asan-<key>/, tsan-<key>/), so
the plain build (build/cpp-tests/<key>/) is untouched. `extension("asan")` builds a sanitized copy of the `p3kv._p3`
extension into build/cpp-tests/ext-asan-<key>/, never over the in-place one; `sanitizer_env` is the environment a
sanitized program or Python process runs with.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from harness import ROOT

CPP = os.path.join(ROOT, "cpp")
CACHE = os.path.join(ROOT, "build", "cpp-tests")
# The public API (cpp/include) and the internal headers beside the sources (cpp/src), which the tests drive.
FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-I", os.path.join(CPP, "include"),
         "-I", os.path.join(CPP, "src")]
LIBS = ["-lcrypto"]
FORMAT = "2"  # bump when the layout of the cache changes
COMPILE_TIMEOUT = 300  # seconds for one compiler process
KEEP = 4  # builds kept in the cache (the current one included)
STALE_S = 600  # a build this many seconds old may be removed
STALE_OBJECTS_S = 86400  # an object no build used for this many seconds is removed
OBJECTS = "objects"  # the folder of CACHE holding the objects, each under its own key
# Compiler and linker flags of each variant ("": the plain build). -fPIC in asan: its library's objects also go
# into the sanitized extension. -fno-sanitize-recover: undefined behaviour ends the program instead of a line of
# output that a passing test would not show.
VARIANTS = {
    "": [],
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g",
             "-fPIC"],
    "tsan": ["-fsanitize=thread", "-fno-omit-frame-pointer", "-g"],
}
# What the sanitizers do on a finding: report with stacks and exit non-zero (SANITIZER_EXIT), at the first one.
# Leak detection is on for the C++ programs (our code only); sanitizer_env(python=True) turns it off (see there).
SANITIZER_EXIT = 66
SANITIZER_OPTIONS = {
    "ASAN_OPTIONS": f"halt_on_error=1:exitcode={SANITIZER_EXIT}:detect_stack_use_after_return=1:"
                    "strict_init_order=1:check_initialization_order=1:detect_leaks=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    "TSAN_OPTIONS": f"halt_on_error=1:exitcode={SANITIZER_EXIT}:second_deadlock_stack=1",
}


class BuildError(RuntimeError):
    """The compiler failed; the message holds its command line and output."""


def compiler() -> str:
    """$CXX, else g++, else c++ (as a resolved path)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise BuildError("no C++ compiler found: apt-get install g++ (or set CXX)")
    found = shutil.which(cxx)
    if found is None:
        raise BuildError(f"the C++ compiler {cxx!r} (CXX) is not an executable")
    return os.path.realpath(found)


def sources() -> list[str]:
    """Every file the test programs are built from (relative to cpp/), sorted."""
    found = [os.path.relpath(p, CPP) for folder in ("include", "src", "tests")
             for p in glob.glob(os.path.join(CPP, folder, "**", "*"), recursive=True)
             if p.endswith((".h", ".cc"))]
    return sorted(found)


def programs() -> list[str]:
    """The test programs: the names of cpp/tests/*_tests.cc, sorted."""
    return sorted(os.path.basename(p)[:-len(".cc")] for p in glob.glob(os.path.join(CPP, "tests", "*_tests.cc")))


def _digest(*parts: str | bytes):
    h = hashlib.sha256()
    for part in parts:
        h.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return h


def _file_digest(rel: str) -> bytes:
    with open(os.path.join(CPP, rel), "rb") as f:
        return rel.encode() + b"\0" + hashlib.sha256(f.read()).digest()


def _flags(variant: str) -> list[str]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown build variant {variant!r}: one of {sorted(VARIANTS)}")
    return FLAGS + VARIANTS[variant]


def _toolchain(cxx: str, variant: str = "") -> bytes:
    """The compiler (its resolved path and its bytes, so an upgraded compiler counts without running it to ask
    its version) and the flags."""
    with open(cxx, "rb") as f:
        compiler_bytes = hashlib.sha256(f.read()).digest()
    # The plain build's digest is what it was before variants existed (its cache stays valid).
    extra = ("|", variant, *VARIANTS[variant]) if variant else ()
    return _digest(FORMAT, cxx, compiler_bytes, *FLAGS, "|", *LIBS, *extra).digest()


def key(cxx: str, variant: str = "") -> str:
    """The build's key: the toolchain, the variant's flags and every source's name and contents."""
    return _digest(_toolchain(cxx, variant), *map(_file_digest, sources())).hexdigest()[:20]


def _object_key(cxx: str, src: str, variant: str = "") -> str:
    """An object's key: the toolchain, its source and every header (any of which it may include)."""
    headers = [rel for rel in sources() if rel.endswith(".h") and not rel.startswith("tests" + os.sep)]
    return _digest(_toolchain(cxx, variant), _file_digest(os.path.relpath(src, CPP)), *map(_file_digest, headers)) \
        .hexdigest()[:20]


def _compile(argv: list[str]) -> None:
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=COMPILE_TIMEOUT)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}")


def _temporary(path: str) -> str:
    return f"{path}.tmp{os.getpid()}"


@contextmanager
def _locked():
    """Holds the cache's build lock (other pytest processes wait; they then find the files built)."""
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _library(cxx: str, folder: str, variant: str = "") -> str:
    """libp3core.a of every cpp/src/*.cc; call with the lock held. Objects are cached by their own key, so a
    change to one source file recompiles that file only (a header change recompiles all)."""
    library = os.path.join(folder, "libp3core.a")
    if os.path.exists(library):
        return library
    objects = os.path.join(CACHE, OBJECTS)
    os.makedirs(objects, exist_ok=True)
    members, missing = [], []
    for src in sorted(glob.glob(os.path.join(CPP, "src", "*.cc"))):
        obj = os.path.join(objects, f"{os.path.basename(src)[:-len('.cc')]}-{_object_key(cxx, src, variant)}.o")
        members.append(obj)
        if not os.path.exists(obj):
            missing.append((src, obj))

    def build(job):
        src, obj = job
        _compile([cxx, *_flags(variant), "-c", src, "-o", _temporary(obj)])
        os.replace(_temporary(obj), obj)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(build, missing))  # list(): re-raises the first BuildError
    for obj in members:
        os.utime(obj)  # in use: _prune keeps it
    ar = shutil.which("ar")
    if ar is None:
        raise BuildError("ar not found: apt-get install binutils")
    os.makedirs(folder, exist_ok=True)
    _compile([ar, "rcs", _temporary(library), *members])
    os.replace(_temporary(library), library)
    _prune(folder)
    return library


def _kind(folder: str) -> str:
    """A build folder's kind: "" (plain: just the key), "asan", "tsan", "ext-asan" (the part before the key)."""
    return os.path.basename(folder).rpartition("-")[0]


def _prune(keep: str) -> None:
    """Removes the builds of older sources of the same kind as `keep`, all but the KEEP newest, and objects no
    build used for a while; nothing younger than STALE_S (a pytest process that started before the sources
    changed may still use it)."""
    now = time.time()
    others = sorted((os.path.getmtime(p), p) for p in glob.glob(os.path.join(CACHE, "*"))
                    if os.path.isdir(p) and p != keep and os.path.basename(p) != OBJECTS and _kind(p) == _kind(keep))
    for mtime, path in others[:max(0, len(others) - (KEEP - 1))]:
        if now - mtime > STALE_S:
            shutil.rmtree(path, ignore_errors=True)
    for obj in glob.glob(os.path.join(CACHE, OBJECTS, "*")):
        if now - os.path.getmtime(obj) > STALE_OBJECTS_S:
            os.remove(obj)


def _folder(variant: str = "") -> tuple[str, str]:
    cxx = compiler()
    _flags(variant)  # an unknown variant fails here, naming the known ones
    k = key(cxx, variant)
    return cxx, os.path.join(CACHE, f"{variant}-{k}" if variant else k)


def library(variant: str = "") -> str:
    """The path of libp3core.a, every cpp/src/*.cc compiled warnings-clean; built only if this key lacks it."""
    cxx, folder = _folder(variant)
    found = os.path.join(folder, "libp3core.a")
    if os.path.exists(found):
        return found  # nothing changed: no compiler at all
    with _locked():
        return _library(cxx, folder, variant)


def program(name: str, variant: str = "") -> str:
    """The path of the test program `name` (e.g. "sender_tests"); built only if this key lacks it."""
    cxx, folder = _folder(variant)
    found = os.path.join(folder, name)
    if os.path.exists(found):
        return found  # nothing changed: no compiler at all
    with _locked():
        lib = _library(cxx, folder, variant)
        if not os.path.exists(found):  # another process may have built it while this one waited for the lock
            _compile([cxx, *_flags(variant), os.path.join(CPP, "tests", f"{name}.cc"), lib, *LIBS, "-o",
                      _temporary(found)])
            os.replace(_temporary(found), found)
    return found


def sanitizer_env(python: bool = False, preload: list[str] | None = None) -> dict[str, str]:
    """This process's environment plus the sanitizers' options (SANITIZER_OPTIONS). `python`: for CPython
    processes, leak detection off (CPython keeps interned objects, its arenas and module state alive until the
    process ends by design, so LeakSanitizer would report the interpreter, not us) and PYTHONMALLOC=malloc (every
    Python object is a malloc block that ASan can watch, instead of a piece of an arena). `preload`: libraries to
    put first in LD_PRELOAD (an uninstrumented python loading a sanitized extension: python_preload())."""
    env = dict(os.environ)
    env.update(SANITIZER_OPTIONS)
    if python:
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=1", "detect_leaks=0")
        env["PYTHONMALLOC"] = "malloc"
    if preload:
        env["LD_PRELOAD"] = os.pathsep.join(p for p in (*preload, env.get("LD_PRELOAD", "")) if p)
    return env


def runtime(name: str = "libasan.so") -> str:
    """The path of the compiler's sanitizer runtime `name` (g++ -print-file-name), for LD_PRELOAD."""
    path = subprocess.run([compiler(), f"-print-file-name={name}"], stdout=subprocess.PIPE, text=True,
                          check=True, timeout=60).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise BuildError(f"the compiler has no {name} ({path!r}): install the sanitizer runtimes (libasan8, "
                         "libubsan1, libtsan2 on Debian 12; they come with g++)")
    return os.path.realpath(path)


def python_preload() -> list[str]:
    """LD_PRELOAD for a python that imports the ASan-built extension: the ASan runtime, which must come first in
    the process, then libstdc++. Without libstdc++ loaded at start-up (python is C) ASan finds no __cxa_throw to
    forward to, and the first C++ exception (any error the bindings raise) aborts the process with
    "AddressSanitizer: CHECK failed: asan_interceptors.cpp ... real___cxa_throw"."""
    return [runtime("libasan.so"), runtime("libstdc++.so")]


def run(name: str, timeout: float = 120, variant: str = "") -> subprocess.CompletedProcess:
    """Builds (if needed) and runs the test program `name`; its output merged into stdout. A sanitized variant
    runs with sanitizer_env()."""
    return subprocess.run([program(name, variant)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=sanitizer_env() if variant else None)


# ---- a sanitized copy of the p3kv._p3 extension ----

PACKAGE = os.path.join(ROOT, "p3kv")
EXTENSION_FOLDERS = ("mxnet", "python")  # cpp/mxnet (the engine bridge) and cpp/python (the bindings), as setup.py


def _python_flags() -> list[str]:
    """The include folders of pybind11 and of this Python (system headers: their warnings are not ours)."""
    try:
        import pybind11
    except ImportError:
        raise BuildError("pybind11 is not installed in this Python, and the sanitized extension is built with its "
                         "headers: pip install pybind11 (the `test` extra of pyproject.toml lists it)") from None
    return ["-isystem", pybind11.get_include(), "-isystem", sysconfig.get_paths()["include"]]


def _extension_sources() -> list[str]:
    return sorted(os.path.relpath(p, CPP) for folder in EXTENSION_FOLDERS
                  for p in glob.glob(os.path.join(CPP, folder, "*")) if p.endswith((".h", ".cc")))


def _link_package(folder: str) -> None:
    """folder/p3kv: a link to every file and subpackage of the checkout's p3kv/ but its built extension (the
    sanitized one sits beside them), made anew on every call so that a module added since the build is there."""
    package = os.path.join(folder, "p3kv")
    for name in os.listdir(PACKAGE):
        if name.startswith("_p3.") or name == "__pycache__":
            continue
        link = os.path.join(package, name)
        if os.path.lexists(link):
            continue
        try:
            os.symlink(os.path.join(PACKAGE, name), link)
        except FileExistsError:
            pass  # another process made it meanwhile


def _extension_object(cxx: str, variant: str, python: list[str], rel: str, headers: list[str]) -> str:
    """Where the extension's object of cpp/`rel` goes: the shared objects folder, under a key of its own
    (toolchain, Python, the source and every header), so a change elsewhere does not compile the bindings again."""
    digest = _digest(_toolchain(cxx, variant), *python, _file_digest(rel), *map(_file_digest, headers))
    return os.path.join(CACHE, OBJECTS, f"ext-{os.path.basename(rel)[:-len('.cc')]}-{digest.hexdigest()[:20]}.o")


def extension(variant: str = "asan") -> str:
    """A folder to put first on PYTHONPATH: its p3kv/ is the checkout's package (linked file by file) with the
    `_p3` extension built with `variant`'s sanitizer flags (every cpp/src, cpp/mxnet and cpp/python source, as
    setup.py builds it, at -O1 with debug information). Built only if its key (toolchain, Python, sources) lacks
    it; the in-place p3kv/_p3*.so is never touched. Processes that import it need sanitizer_env(python=True,
    preload=runtime()): python itself is not instrumented, so the ASan runtime must be loaded first."""
    if variant != "asan":
        raise ValueError(f"the sanitized extension is built with asan only, not {variant!r}")
    cxx = compiler()
    python = _python_flags()
    digest = _digest(_toolchain(cxx, variant), *python, sys.version,
                     *map(_file_digest, [rel for rel in sources() if not rel.startswith("tests" + os.sep)]
                          + _extension_sources())).hexdigest()[:20]
    folder = os.path.join(CACHE, f"ext-{variant}-{digest}")
    target = os.path.join(folder, "p3kv", "_p3" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(target):
        with _locked():
            if not os.path.exists(target):
                # The asan test programs' library (same objects); its folder is keyed by the tests' sources too.
                lib = _library(cxx, os.path.join(CACHE, f"{variant}-{key(cxx, variant)}"), variant)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                headers = [rel for rel in sources() + _extension_sources()
                           if rel.endswith(".h") and not rel.startswith("tests" + os.sep)]
                # Not -Werror: the plain tier checks warnings; pybind11's templates are not ours to fix.
                flags = [f for f in _flags(variant) if f != "-Werror"] + [
                    "-fvisibility=hidden", "-I", os.path.join(CPP, "mxnet"), "-I", os.path.join(CPP, "python"),
                    *python]
                jobs = [(os.path.join(CPP, rel), _extension_object(cxx, variant, python, rel, headers))
                        for rel in _extension_sources() if rel.endswith(".cc")]
                jobs_missing = [job for job in jobs if not os.path.exists(job[1])]

                def build(job):
                    src, obj = job
                    _compile([cxx, *flags, "-c", src, "-o", _temporary(obj)])
                    os.replace(_temporary(obj), obj)

                with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                    list(pool.map(build, jobs_missing))
                for _, obj in jobs:
                    os.utime(obj)  # in use: _prune keeps it
                # --whole-archive: every object of the core, as setup.py links them all.
                _compile([cxx, "-shared", *VARIANTS[variant], "-pthread", *(obj for _, obj in jobs),
                          "-Wl,--whole-archive", lib, "-Wl,--no-whole-archive", "-ldl", *LIBS, "-o",
                          _temporary(target)])
                os.replace(_temporary(target), target)
                _prune(folder)
    _link_package(folder)
    return folder

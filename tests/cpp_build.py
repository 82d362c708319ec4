"""Builds the C++ unit test programs (cpp/tests/NAME_tests.cc, each with its own main) once per change of the C++
code, not once per test run.

Every cpp/src/*.cc is compiled warnings-clean (-Wall -Wextra -Werror) into one static library, and each test
program is linked against it (the linker takes only the objects a program uses), into build/cpp-tests/<key>/,
where the key hashes the C++ sources and headers, the flags and the compiler. A run that finds its key's files
reuses them without starting the compiler. Objects are kept under keys of their own (build/cpp-tests/objects/),
so after a change only the sources it touches are compiled again. Concurrent pytest processes take a file lock
around a build, and every file is written under a temporary name and renamed into place, so a killed build
leaves no half-written library or program behind. A new build removes all but the few newest old ones.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
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


def _toolchain(cxx: str) -> bytes:
    """The compiler (its resolved path and its bytes, so an upgraded compiler counts without running it to ask
    its version) and the flags."""
    with open(cxx, "rb") as f:
        return _digest(FORMAT, cxx, hashlib.sha256(f.read()).digest(), *FLAGS, "|", *LIBS).digest()


def key(cxx: str) -> str:
    """The build's key: the toolchain and every source's name and contents."""
    return _digest(_toolchain(cxx), *map(_file_digest, sources())).hexdigest()[:20]


def _object_key(cxx: str, src: str) -> str:
    """An object's key: the toolchain, its source and every header (any of which it may include)."""
    headers = [rel for rel in sources() if rel.endswith(".h") and not rel.startswith("tests" + os.sep)]
    return _digest(_toolchain(cxx), _file_digest(os.path.relpath(src, CPP)), *map(_file_digest, headers)) \
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


def _library(cxx: str, folder: str) -> str:
    """libp3core.a of every cpp/src/*.cc; call with the lock held. Objects are cached by their own key, so a
    change to one source file recompiles that file only (a header change recompiles all)."""
    library = os.path.join(folder, "libp3core.a")
    if os.path.exists(library):
        return library
    objects = os.path.join(CACHE, OBJECTS)
    os.makedirs(objects, exist_ok=True)
    members, missing = [], []
    for src in sorted(glob.glob(os.path.join(CPP, "src", "*.cc"))):
        obj = os.path.join(objects, f"{os.path.basename(src)[:-len('.cc')]}-{_object_key(cxx, src)}.o")
        members.append(obj)
        if not os.path.exists(obj):
            missing.append((src, obj))

    def build(job):
        src, obj = job
        _compile([cxx, *FLAGS, "-c", src, "-o", _temporary(obj)])
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


def _prune(keep: str) -> None:
    """Removes the builds of older sources, all but the KEEP newest, and objects no build used for a while;
    nothing younger than STALE_S (a pytest process that started before the sources changed may still use it)."""
    now = time.time()
    others = sorted((os.path.getmtime(p), p) for p in glob.glob(os.path.join(CACHE, "*"))
                    if os.path.isdir(p) and p != keep and os.path.basename(p) != OBJECTS)
    for mtime, path in others[:max(0, len(others) - (KEEP - 1))]:
        if now - mtime > STALE_S:
            shutil.rmtree(path, ignore_errors=True)
    for obj in glob.glob(os.path.join(CACHE, OBJECTS, "*")):
        if now - os.path.getmtime(obj) > STALE_OBJECTS_S:
            os.remove(obj)


def _folder() -> tuple[str, str]:
    cxx = compiler()
    return cxx, os.path.join(CACHE, key(cxx))


def library() -> str:
    """The path of libp3core.a, every cpp/src/*.cc compiled warnings-clean; built only if this key lacks it."""
    cxx, folder = _folder()
    found = os.path.join(folder, "libp3core.a")
    if os.path.exists(found):
        return found  # nothing changed: no compiler at all
    with _locked():
        return _library(cxx, folder)


def program(name: str) -> str:
    """The path of the test program `name` (e.g. "sender_tests"); built only if this key lacks it."""
    cxx, folder = _folder()
    found = os.path.join(folder, name)
    if os.path.exists(found):
        return found  # nothing changed: no compiler at all
    with _locked():
        lib = _library(cxx, folder)
        if not os.path.exists(found):  # another process may have built it while this one waited for the lock
            _compile([cxx, *FLAGS, os.path.join(CPP, "tests", f"{name}.cc"), lib, *LIBS, "-o", _temporary(found)])
            os.replace(_temporary(found), found)
    return found


def run(name: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Builds (if needed) and runs the test program `name`; its output merged into stdout."""
    return subprocess.run([program(name)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)

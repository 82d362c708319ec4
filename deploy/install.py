"""`fab install`: copy the project to every host (the same path everywhere), give it a Python, check it imports.

The copy is a tarball of the checkout's files (git's tracked and untracked-but-not-ignored files, or every file
outside build and cache folders when there is no git) uploaded over the Fabric connection and unpacked in place.
Each host's copy is marked with PATH/.p3kv-deploy.json (the install's token and the Python to use): a directory
without that mark is never written into, so installing onto the checkout itself is refused, and a host that
already sees this install's token shares the filesystem with one done before it and is not copied again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shlex
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence

from deploy.hosts import Host
from deploy.remote import ConnectionFactory, HostError, Session, remote_command

LOG = logging.getLogger("p3kv.deploy")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = ".p3kv-deploy.json"
DEFAULT_PATH = "~/p3kv"
# What pip installs into a virtualenv that install creates (mxnet 1.9.1 needs numpy<1.24; see the README).
MXNET_PACKAGES = {
    "cpu": ["mxnet==1.9.1", "scipy<1.12"],
    "cu112": ["mxnet-cu112==1.9.1", "scipy<1.12"],
    "none": [],
}
BUILD_PACKAGES = ["numpy>=1.17,<1.24", "setuptools>=77", "wheel", "pybind11>=2.10"]
# Horovod with MXNet and Gloo only (CPU collectives; no MPI, TensorFlow or PyTorch): `fab bench`'s allreduce system.
HOROVOD = "horovod==0.28.1"
HOROVOD_BUILD = {"HOROVOD_WITH_MXNET": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
                 "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_PYTORCH": "1"}
HOROVOD_NEEDS = ["setuptools", "wheel", "pyyaml", "packaging", "cloudpickle", "psutil"]  # its build imports them
_FIND_CMAKE3 = ('for c in cmake3 cmake /usr/bin/cmake; do case "$($c --version 2>/dev/null | head -n 1)" in '
                '"cmake version 3."*) echo "$c"; break;; esac; done; true')
_SKIP_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}


@dataclasses.dataclass(frozen=True)
class Installed:
    """What one host ended up with."""

    path: str  # the project's folder there
    python: str  # the interpreter jobs run with
    copied: bool  # False: the folder already held this install (a filesystem shared with another host)
    mxnet: str  # mxnet.__version__ there
    horovod: str = ""  # horovod.__version__ there when install was asked for it


def project_files(root: str = PROJECT_ROOT, prebuilt: bool = False) -> list[str]:
    """The project's files (relative to `root`) that install copies. `prebuilt`: also the built C++ extension."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True, timeout=60).stdout.decode()
        files = [f for f in listed.split("\0") if f and os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names if not n.endswith((".so", ".pyc"))]
    if prebuilt:
        built = [os.path.join("p3kv", n) for n in os.listdir(os.path.join(root, "p3kv"))
                 if n.startswith("_p3.") and n.endswith(".so")]
        if not built:
            raise FileNotFoundError(f"--prebuilt: no built extension p3kv/_p3*.so in {root}; build it with "
                                    "pip install -e . or leave --prebuilt out to build on every host")
        files += built
    return sorted(set(files))


def _pack(root: str, files: Sequence[str], into: str) -> None:
    with tarfile.open(into, "w:gz") as tar:
        for name in files:
            tar.add(os.path.join(root, name), arcname=name, recursive=False)


def _copy(session: Session, host: Host, target: str, tarball: str, marker: dict) -> bool:
    """Copies the tarball to `target` on `host` unless it already holds this install; whether it copied."""
    found = session.read_file(host, f"{target}/{MARKER}")
    if found is not None:
        try:
            if json.loads(found).get("token") == marker["token"]:
                return False
        except ValueError:
            pass
    else:
        q = shlex.quote(target)
        session.run(host, f"test ! -e {q} || test -z \"$(ls -A {q})\"", f"installing into {target}",
                    f"{target} exists and is not a p3kv deployment (no {MARKER}); choose another --path or empty it")
    session.run(host, f"mkdir -p {shlex.quote(target)}", f"creating {target}", "pick a --path you may write to")
    upload = f"{target}/.p3kv-upload-{marker['token']}.tar.gz"
    session.connection(host).put(tarball, upload)
    session.run(host, f"tar -xzf {shlex.quote(upload)} -C {shlex.quote(target)} && rm -f {shlex.quote(upload)}",
                f"unpacking the project into {target}", "check the free space there")
    session.write_file(host, f"{target}/{MARKER}", json.dumps({**marker, "ready": False}))
    return True


def _set_up(session: Session, host: Host, target: str, marker: dict, *, venv: str | None, base_python: str,
            mxnet: str | None, prebuilt: bool, system_site_packages: bool, horovod: bool) -> None:
    """Gives the copy at `target` its Python: a new virtualenv (default) or the existing `venv`; builds p3kv."""
    python = marker["python"]
    if venv is None:
        venv_dir = os.path.dirname(os.path.dirname(python))
        flags = ["--system-site-packages"] if system_site_packages else []
        session.run(host, remote_command([base_python, "-m", "venv", *flags, venv_dir]),
                    f"creating a virtualenv with {base_python}",
                    "install Python 3.9+ with venv there (e.g. apt-get install python3-venv) or pass --python")
        packages = ([] if prebuilt else BUILD_PACKAGES) + MXNET_PACKAGES[mxnet or "cpu"]
    else:
        session.run(host, f"test -x {shlex.quote(python)}", f"using the virtualenv {venv}",
                    f"there is no Python at {python}: create that virtualenv there, or leave --venv out to "
                    "let install create one")
        packages = MXNET_PACKAGES[mxnet or "none"]
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if packages:
        session.run(host, remote_command([*pip, *packages]), f"pip install {' '.join(packages)}",
                    "check the host's access to the package index (or use --venv with a ready virtualenv)")
    if not prebuilt:
        session.run(host, remote_command([*pip, "--no-deps", "--no-build-isolation", "-e", target]),
                    "building p3kv (pip install -e)", "the host needs g++ and the OpenSSL headers (apt-get install "
                    "g++ libssl-dev); or pass --prebuilt when the hosts match this machine")
    if horovod:
        _install_horovod(session, host, python)
    session.write_file(host, f"{target}/{MARKER}", json.dumps({**marker, "ready": True}))


def _install_horovod(session: Session, host: Host, python: str) -> None:
    """Builds Horovod into the virtualenv (against its mxnet). Its bundled Gloo needs CMake 3 (CMake 4 refuses
    it): the host's first CMake 3 (cmake3, cmake, /usr/bin/cmake), else pip's cmake<4 in the virtualenv."""
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    cmake = session.run(host, _FIND_CMAKE3, "looking for CMake 3").strip()
    if not cmake:
        session.run(host, remote_command([*pip, "cmake>=3.13,<4"]), "pip install cmake<4 (Horovod's Gloo needs 3.x)",
                    "check the host's access to the package index, or install CMake 3 there")
        cmake = os.path.join(os.path.dirname(python), "cmake")
    session.run(host, remote_command([*pip, *HOROVOD_NEEDS]), f"pip install {' '.join(HOROVOD_NEEDS)}",
                "check the host's access to the package index")
    session.run(host, remote_command([*pip, "--no-build-isolation", HOROVOD], env={**HOROVOD_BUILD,
                                                                                   "HOROVOD_CMAKE": cmake}),
                f"building {HOROVOD} with MXNet and Gloo (about 2 minutes per core)",
                "the host needs g++ and the virtualenv's mxnet (install it with --mxnet)")


def deployed_python(session: Session, host: Host, target: str) -> str:
    """The Python of the installed copy at `target` on `host`; HostError if there is none."""
    found = session.read_file(host, f"{target}/{MARKER}")
    if found is None:
        raise HostError(host, f"no p3kv deployment at {target}: run fab install --path {target} first")
    marker = json.loads(found)
    if not marker.get("ready"):
        raise HostError(host, f"the install at {target} did not finish: run fab install --path {target} again")
    return str(marker["python"])


def check(session: Session, host: Host, target: str) -> tuple[str, str]:
    """(python, mxnet version) after checking that the deployment on `host` imports p3kv (from `target`) and
    mxnet; HostError naming what is missing otherwise."""
    python = deployed_python(session, host, target)
    script = "import os, p3kv, p3kv._p3, mxnet; print(os.path.dirname(os.path.dirname(p3kv.__file__))); " \
             "print(mxnet.__version__)"
    out = session.run(host, remote_command([python, "-c", script], env={"PYTHONPATH": target}, cwd="/"),
                      f"checking that {python} imports p3kv and mxnet",
                      "rerun fab install (with --mxnet cpu or --mxnet cu112 to put MXNet into the virtualenv)")
    lines = out.strip().splitlines()
    if len(lines) < 2 or lines[-2] != target:
        raise HostError(host, f"{python} imports p3kv from {lines[-2] if lines else '?'}, not from {target}")
    return python, lines[-1]


def install(hosts: Sequence[Host], connect: ConnectionFactory, *, path: str = DEFAULT_PATH, venv: str | None = None,
            python: str = "python3", mxnet: str | None = None, prebuilt: bool = False,
            system_site_packages: bool = False, horovod: bool = False, source: str = PROJECT_ROOT
            ) -> dict[str, Installed]:
    """Installs the project at `path` on every host; {label: Installed}. Raises DeployError naming each host that
    failed (and why), after doing what it could on the others.

    `venv`: an existing virtualenv on the hosts to use (it must hold mxnet unless `mxnet` is given); default:
    create PATH/.venv with `python` and pip install mxnet (`mxnet`: cpu, cu112 or none) and p3kv's build
    requirements into it. `prebuilt`: ship this machine's built extension instead of building on each host
    (only for hosts with the same Python, glibc and OpenSSL). `horovod`: also build Horovod with MXNet and Gloo
    into the virtualenv (`fab bench`'s fourth system). Jobs import p3kv from PATH (PYTHONPATH)."""
    if mxnet is not None and mxnet not in MXNET_PACKAGES:
        raise ValueError(f"--mxnet {mxnet!r}: use one of {', '.join(MXNET_PACKAGES)}")
    files = project_files(source, prebuilt)
    token = secrets.token_hex(8)
    with Session(hosts, connect) as session, tempfile.TemporaryDirectory() as tmp:
        tarball = os.path.join(tmp, "p3kv.tar.gz")
        _pack(source, files, tarball)
        targets = session.each(lambda h: session.resolve(h, path), "finding the install path")

        def copy(host: Host) -> bool:
            target = targets[host.label]
            python_path = f"{venv.rstrip('/')}/bin/python" if venv else f"{target}/.venv/bin/python"
            return _copy(session, host, target, tarball, {"token": token, "python": python_path})

        # One host after another: on a shared filesystem the first copy is seen by the others, which skip it.
        copied = session.each(copy, "copying the project", parallel=False)
        LOG.info("copied %d files to %d host(s)", len(files), sum(copied.values()))

        def set_up(host: Host) -> None:
            target = targets[host.label]
            marker = json.loads(session.read_file(host, f"{target}/{MARKER}") or "{}")
            _set_up(session, host, target, marker, venv=venv, base_python=python, mxnet=mxnet, prebuilt=prebuilt,
                    system_site_packages=system_site_packages, horovod=horovod)

        session.each(set_up, "setting up Python", [h for h in hosts if copied[h.label]])
        checked = session.each(lambda h: check(session, h, targets[h.label]), "checking the install")
        versions = session.each(lambda h: check_horovod(session, h, checked[h.label][0]),
                                "checking Horovod") if horovod else {}
    return {h.label: Installed(targets[h.label], checked[h.label][0], copied[h.label], checked[h.label][1],
                               versions.get(h.label, "")) for h in hosts}


HOROVOD_CHECK = ("import horovod, horovod.mxnet as h; assert h.gloo_built(), 'built without Gloo'; "
                 "print(horovod.__version__)")


def check_horovod(session: Session, host: Host, python: str) -> str:
    """horovod.__version__ of `python` on `host` after checking horovod.mxnet imports with Gloo; HostError else."""
    out = session.run(host, remote_command([python, "-c", HOROVOD_CHECK], cwd="/"),
                      f"checking that {python} imports horovod.mxnet with Gloo",
                      "run fab install --horovod (it builds Horovod with MXNet and Gloo into the virtualenv)")
    return out.strip().splitlines()[-1]

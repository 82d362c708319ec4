"""`make test` sets up a fresh Debian machine itself: scripts/system-deps.sh installs the missing system packages
(as root, or through sudo, or says what to do), the Makefile's setup runs it, and .ci/run is the README's test
command. The script runs here against stub commands (id, sudo, apt-get) and a fake file system root."""

import os
import stat
import subprocess

import pytest
from harness import ROOT

pytestmark = pytest.mark.unit

SCRIPT = os.path.join(ROOT, "scripts", "system-deps.sh")
ALL = "g++ make libssl-dev python3-venv iproute2 openssh-server"


def stub(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run(tmp_path, *, uid, sudo=None, have=(), files=(), tty=False):
    """Runs the script with only stub commands on PATH; returns (exit code, output, apt-get calls)."""
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    os.symlink("/usr/bin/env", bin_dir / "env")
    stub(bin_dir, "id", f"echo {uid}")
    stub(bin_dir, "apt-get", f'echo "$(id -u) $DEBIAN_FRONTEND $*" >> {log}')
    if sudo is not None:  # "nopasswd": sudo -n works; "password": it needs a terminal
        check = 'if [ "$1" = -n ]; then exit 1; fi' if sudo == "password" else ""
        stub(bin_dir, "sudo", f'{check}\n[ "$1" = -n ] && shift\n[ "$1" = true ] && exit 0\nPATH={bin_dir} exec "$@"')
        # apt-get through sudo runs as root
        stub(bin_dir, "apt-get", f'echo "root-via-sudo $DEBIAN_FRONTEND $*" >> {log}' if uid else "")
    for name in have:
        stub(bin_dir, name, "exit 0")
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
        (root / f).chmod(0o755)
    result = subprocess.run(["/bin/bash", SCRIPT], env={"PATH": str(bin_dir), "DEPS_ROOT": str(root)},
                            stdin=None if tty else subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines() if log.exists() else []
    return result.returncode, result.stdout + result.stderr, calls


def test_root_installs_every_missing_package_without_questions(tmp_path):
    code, output, calls = run(tmp_path, uid=0)
    assert code == 0, output
    assert calls == ["0 noninteractive update -qq", f"0 noninteractive install -y -qq {ALL}"]


def test_non_root_installs_through_sudo(tmp_path):
    code, output, calls = run(tmp_path, uid=1000, sudo="nopasswd", have=("g++", "make", "python3", "ip", "tc"),
                              files=("usr/sbin/sshd",))
    assert code == 0, output
    assert calls == ["root-via-sudo noninteractive update -qq", "root-via-sudo noninteractive install -y -qq "
                     "libssl-dev"]
    assert "installing libssl-dev (through sudo)" in output


@pytest.mark.parametrize("sudo", [None, "password"], ids=["no-sudo", "sudo-needs-a-password-and-no-terminal"])
def test_without_root_or_sudo_it_names_the_packages_and_fails(tmp_path, sudo):
    code, output, calls = run(tmp_path, uid=1000, sudo=sudo, have=("g++", "make", "python3", "ip", "tc"),
                              files=("usr/include/openssl/hmac.h",))
    assert code == 1 and not calls
    assert "missing openssh-server; installing them needs root: run 'apt-get install openssh-server' as root" in \
        output


def test_nothing_missing_does_nothing(tmp_path):
    code, output, calls = run(tmp_path, uid=1000, have=("g++", "make", "python3", "ip", "tc"),
                              files=("usr/include/openssl/hmac.h", "usr/sbin/sshd"))
    assert (code, output, calls) == (0, "", [])


def test_make_setup_runs_it_and_ci_runs_the_readme_command():
    # A make of its own: under `make test` (CI) the parent's MAKEFLAGS/MAKELEVEL would make it print
    # "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-B", "test"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=env)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == "bash scripts/system-deps.sh", lines[:3]  # before the venv and the build
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        commands = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    assert commands[-1] == "make test" and not any("apt-get" in c for c in commands), commands

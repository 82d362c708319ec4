#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that `make setup` (so `make test` and `make demo`) needs and that are
# missing: as root directly (CI runs as root on a fresh machine, without a terminal), otherwise through sudo;
# with neither it names the packages and fails. Does nothing when everything is there.
#   g++, make, libssl-dev    build the C++ core (the handshake's HMAC is OpenSSL's)
#   python3-venv             the virtual environment
#   iproute2                 ip and tc: the emulated cluster (namespaces, shaped links) of the demo and tests
#   openssh-server           sshd: tests/test_deploy.py deploys over real SSH to emulated hosts
# DEPS_ROOT (tests only) prefixes the files it checks.
set -euo pipefail
root="${DEPS_ROOT:-}"
need=()
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
[ -f "$root/usr/include/openssl/hmac.h" ] || need+=(libssl-dev)
{ command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null; } || need+=(python3-venv)
{ command -v ip >/dev/null && command -v tc >/dev/null; } || need+=(iproute2)
[ -x "$root/usr/sbin/sshd" ] || need+=(openssh-server)
[ ${#need[@]} -eq 0 ] && exit 0

packages="${need[*]}"
if ! command -v apt-get >/dev/null; then
  echo "system-deps: missing $packages, and this is not a Debian-like system (no apt-get): install their" \
       "equivalents, then run make again" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
  as_root=(sudo)  # without a password, or asking for it on this terminal
else
  echo "system-deps: missing $packages; installing them needs root: run" \
       "'apt-get install $packages' as root (or make with sudo available), then make again" >&2
  exit 1
fi
echo "system-deps: installing $packages${as_root:+ (through sudo)}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"

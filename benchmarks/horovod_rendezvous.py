"""Horovod's Gloo rendezvous for ranks we start ourselves (one per emulated host, no horovodrun, no ssh).

    python benchmarks/horovod_rendezvous.py --hosts 10.77.0.1 10.77.0.2

Runs Horovod's own HTTP rendezvous server with the slot plan of one rank per host (rank i on host i), prints
the port it listens on, and serves until its stdin closes. Each rank then needs the environment horovodrun's
Gloo launcher would give it (`rank_environment`).
"""

from __future__ import annotations

import argparse
import sys


def rank_environment(rank: int, hosts: list[str], rendezvous_addr: str, port: int, iface: str) -> dict[str, str]:
    """What horovod.runner.gloo_run sets for a rank: its slot (one per host) and the rendezvous."""
    return {
        "HOROVOD_HOSTNAME": hosts[rank], "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(hosts)),
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": str(len(hosts)), "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", nargs="+", required=True, help="one address per rank, rank order")
    args = parser.parse_args(argv)
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts(",".join(f"{h}:1" for h in args.hosts)), len(args.hosts)))
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the runner closes our stdin (or kills us)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

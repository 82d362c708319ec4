"""A stand-in for a scheduler, server or worker in the launcher's tests (no MXNet, no p3kv needed).

Prints ``ready <role> pid=<pid>`` plus the variables named by --print-env, then does what the options say:
--report FIFO writes this pid (and a grandchild's, with --grandchild) into a named pipe; --collect FIFO reads
such a report and prints it; --block waits until killed; --ignore-sigterm makes that wait outlast SIGTERM;
--exit-on-sigterm makes SIGTERM end it with code 0 (a companion service); --exit CODE sets the exit code.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default=os.environ.get("P3_ROLE") or os.environ.get("DMLC_ROLE", "?"))
    parser.add_argument("--print-env", nargs="*", default=[])
    parser.add_argument("--report")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--collect")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-on-sigterm", action="store_true")
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_on_sigterm:
        def stopped(*_):
            print("stopped by SIGTERM", flush=True)
            os._exit(0)

        signal.signal(signal.SIGTERM, stopped)
    pids = [os.getpid()]
    if args.grandchild:
        # Left running on purpose: the launcher must kill it with its parent's process group.
        grandchild = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        pids.append(grandchild.pid)
    print(f"ready {args.role} pids={','.join(map(str, pids))}", flush=True)
    for name in args.print_env:
        print(f"env {name}={os.environ.get(name, '<unset>')}", flush=True)
    if args.report:
        with open(args.report, "w") as fifo:  # blocks until the collector opens the other end
            fifo.write(",".join(map(str, pids)))
    if args.collect:
        with open(args.collect) as fifo:
            print(f"collected pids={fifo.read()}", flush=True)
    if args.block:
        threading.Event().wait()
    return args.exit


if __name__ == "__main__":
    sys.exit(main())

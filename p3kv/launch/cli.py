"""The launcher's command line: ``python -m p3kv.launch -n W -s S [options] -- COMMAND`` (see --help)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence

from p3kv.core import config
from p3kv.core.errors import ConfigError
from p3kv.launch.horovod import parse_slots
from p3kv.launch.job import DEFAULT_GRACE, SERVER_MODULES, Job, KVStore
from p3kv.launch.launcher import LOG, launch


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} (see python -m p3kv.launch --help)")


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("_", "a").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _command(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _slots(text: str) -> tuple[tuple[str, int], ...]:
    try:
        return parse_slots(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m p3kv.launch", description="Run a p3kv job (or a baseline: MXNet dist_sync, "
                "MXNet's P3, Horovod) on this machine: 1 scheduler, S servers and W workers running COMMAND.")
    p.add_argument("-n", "--num-workers", type=int, required=True, metavar="W", help="number of workers")
    p.add_argument("-s", "--num-servers", type=int, required=True, metavar="S", help="number of servers")
    p.add_argument("--kvstore", choices=[k.value for k in KVStore], default=KVStore.P3.value,
                   help="p3 (default); dist_sync or mxnet-p3 run MXNet's own parameter server as a baseline; "
                   "horovod runs Horovod's ring allreduce over Gloo (-s 0; the rendezvous takes the scheduler's "
                   "place)")
    p.add_argument("--host", default="127.0.0.1", help="address of this machine the processes use "
                   "(default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    p.add_argument("--local-workers", type=int, metavar="K", help="a job across hosts: start K of the W "
                   "workers on this host (default: all)")
    p.add_argument("--local-servers", type=int, metavar="K", help="start K of the S servers on this host "
                   "(default: all)")
    p.add_argument("--no-scheduler", action="store_true", help="the scheduler runs on another host, at --root "
                   "and --port")
    p.add_argument("--root", metavar="ADDRESS", help="with --no-scheduler: the scheduler's address")
    p.add_argument("--slots", type=_slots, metavar="ADDR:K,...", help="--kvstore horovod across hosts: every "
                   "host's address and worker count, in rank order (the same on every host)")
    p.add_argument("--server-command", type=_command, metavar="CMD", help="run CMD as each server instead of "
                   "the default (split like a shell does)")
    p.add_argument("--servers", choices=sorted(SERVER_MODULES), default="mxnet", help="p3 jobs: mxnet (default) "
                   "runs the MXNet optimizer a worker sends (and p3kv.torch's kernels); core runs framework-free "
                   "servers that import neither MXNet nor torch: they sum gradients, or run the native kernels "
                   "p3kv.torch's placement='server' asks for")
    p.add_argument("--scheduler-command", type=_command, metavar="CMD", help="run CMD as the scheduler")
    p.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="set KEY for every process (repeatable), e.g. --env P3_SLICE_SIZE=40000")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="kill the job after SECONDS; exit 124")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS", help="how long the scheduler "
                   f"and servers may take to exit after the last worker (default {DEFAULT_GRACE:g})")
    p.add_argument("--log-dir", metavar="DIR", help="also write each process's output to DIR/scheduler.log, "
                   "DIR/server<i>.log, DIR/worker<i>.log (Horovod: DIR/rendezvous.log)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the launcher does")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command (after --)")
    return p


def job_from_args(argv: Sequence[str]) -> tuple[Job, bool]:
    """Parse the command line into a Job and the --verbose flag. Raises ConfigError."""
    args = _parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    job = Job(command=tuple(command), num_workers=args.num_workers, num_servers=args.num_servers,
              kvstore=KVStore(args.kvstore), host=args.host, port=args.port, env=dict(args.env),
              server_command=args.server_command, scheduler_command=args.scheduler_command,
              timeout=args.timeout, log_dir=args.log_dir, grace=args.grace, local_workers=args.local_workers,
              local_servers=args.local_servers, scheduler=not args.no_scheduler, root=args.root,
              slots=args.slots, servers=args.servers)
    return job, args.verbose


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        job, verbose = job_from_args(sys.argv[1:] if argv is None else argv)
        level = "INFO" if verbose else str(config.get("P3_LOG_LEVEL")).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ConfigError(f"P3_LOG_LEVEL={level!r} is not a log level: use DEBUG, INFO, WARNING or ERROR")
        logging.getLogger("p3kv").setLevel(level)
        return launch(job)
    except ConfigError as e:
        LOG.error("%s", e)
        return 2

"""Deploy p3kv to a cluster over SSH with Fabric: `fab -f deploy/fabfile.py --list` shows the tasks.

The tasks are thin wrappers of plain functions that take the hosts (`read_hosts_file`) and a connection factory
(`default_connect()`, or your own), so scripts and tests call them directly.
"""

from deploy.compare import CompareResult, compare
from deploy.hosts import Host, HostsFileError, parse_hosts, read_hosts_file
from deploy.install import install
from deploy.job import BenchResult, JobResult, JobState, bench, launch, logs, status, stop
from deploy.network import bandwidth
from deploy.remote import DeployError, HostError, Session, default_connect

__all__ = ["BenchResult", "CompareResult", "DeployError", "Host", "HostError", "HostsFileError", "JobResult",
           "JobState", "Session", "bandwidth", "bench", "compare", "default_connect", "install", "launch", "logs",
           "parse_hosts", "read_hosts_file", "status", "stop"]

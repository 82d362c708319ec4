"""What this machine remembers about a launched job: its hosts, folders and pids (one JSON file per job).

The state folder (default ~/.p3kv-deploy) holds <job id>.json per job and `latest`, the newest job's id, so
`fab status`, `logs` and `stop` find a job without being told which.
"""

from __future__ import annotations

import dataclasses
import json
import os

DEFAULT_STATE_DIR = "~/.p3kv-deploy"


@dataclasses.dataclass(frozen=True)
class HostJob:
    """One host's part of a job."""

    label: str
    path: str  # the deployment's folder
    job_dir: str
    workers: int
    servers: int
    address: str
    monitor_pid: int


@dataclasses.dataclass(frozen=True)
class JobState:
    """A launched job, as this machine remembers it."""

    job_id: str
    kvstore: str
    command: tuple[str, ...]
    num_workers: int
    num_servers: int
    port: int
    hosts: tuple[HostJob, ...]

    def save(self, state_dir: str) -> str:
        folder = os.path.expanduser(state_dir)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.job_id}.json")
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=1)
        with open(os.path.join(folder, "latest"), "w") as f:
            f.write(self.job_id + "\n")
        return path

    @classmethod
    def load(cls, state_dir: str = DEFAULT_STATE_DIR, job_id: str | None = None) -> JobState:
        """A saved job (default: the latest); FileNotFoundError saying what to do when there is none."""
        folder = os.path.expanduser(state_dir)
        try:
            if job_id is None:
                with open(os.path.join(folder, "latest")) as f:
                    job_id = f.read().strip()
            with open(os.path.join(folder, f"{job_id}.json")) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"no job {job_id or 'launched yet'} in {folder}: launch one first (fab launch), "
                                    "or pass --job and --state-dir of an existing one") from None
        data["command"] = tuple(data["command"])
        data["hosts"] = tuple(HostJob(**h) for h in data["hosts"])
        return cls(**data)

"""Which commit a copied working tree is, where its .git cannot say: a manifest of the commit's files, checked file
by file.

The lent accelerator (the `device` tool) runs on a copy of the working tree whose .git is older than the tree (the
session's first commit travels), so `git rev-parse HEAD` there names a stale commit and every file changed since
looks uncommitted. Before a device run, write the manifest here (the commit and each tracked file's blob hash, as
`git ls-files -s` gives them) into an ignored path and carry it; there, P3_TREE_MANIFEST=that path makes the run
guard (run_guard.git_state) hash each listed file as git would and record the manifest's commit, clean only when
every file outside the benchmarks' own outputs matches it.

    python -m benchmarks.emulation.tree_manifest build/tree-manifest    # here, on a committed tree
    P3_TREE_MANIFEST=build/tree-manifest python -m benchmarks ...         # there (carry build/tree-manifest)
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence

LOG = logging.getLogger("tree_manifest")
VARIABLE = "P3_TREE_MANIFEST"
GITLINK = "160000"  # a submodule's entry: no file of its own to hash


def blob_hash(path: pathlib.Path) -> str:
    """The object name git gives the file's content (a symlink's: its target)."""
    data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write(out: pathlib.Path, root: pathlib.Path) -> str:
    """Write the manifest of HEAD at `root` to `out`; refuse a tree with uncommitted changes to tracked files (the
    manifest would name a commit the files are not). Returns the commit."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout

    if git("status", "--porcelain", "--untracked-files=no").strip():
        raise SystemExit(f"{root} has uncommitted changes to tracked files: commit them first, so that the manifest "
                         "names the commit the files are")
    commit = git("rev-parse", "HEAD").strip()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"commit {commit}\n" + git("ls-files", "-s"))
    return commit


def check(manifest: pathlib.Path, root: pathlib.Path, excluded: Sequence[str] = ()) -> tuple[str, list[str]]:
    """(the manifest's commit, the tracked paths outside `excluded` whose files differ from it or are missing)."""
    lines = manifest.read_text().splitlines()
    if not lines or not lines[0].startswith("commit "):
        raise ValueError(f"{manifest} is not a tree manifest (its first line must be 'commit <sha>'): write one "
                         "with python -m benchmarks.emulation.tree_manifest PATH")
    commit = lines[0].split()[1]
    differ = []
    for line in lines[1:]:
        meta, _, name = line.partition("\t")
        mode, sha = meta.split()[:2]
        if mode == GITLINK or any(name == e or name.startswith(e.rstrip("/") + "/") for e in excluded):
            continue
        path = root / name
        if not (path.exists() or path.is_symlink()) or blob_hash(path) != sha:
            differ.append(name)
    return commit, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=pathlib.Path, help="where to write it (an ignored path, carried to the device)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from benchmarks.paths import ROOT

    commit = write(args.out, ROOT)
    LOG.info("%s: the tree at %s; on the copy, %s=%s", args.out, commit[:12], VARIABLE, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

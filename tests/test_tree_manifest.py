"""A copied tree's commit from a manifest (benchmarks/emulation/tree_manifest.py), as on the lent accelerator whose
.git lags the tree: the manifest's commit is recorded, clean only when every tracked file outside the benchmarks'
outputs hashes as git hashed it. Fast: a throwaway git repository."""

import os
import shutil
import subprocess

import pytest

from benchmarks.emulation import run_guard, tree_manifest

pytestmark = pytest.mark.unit


def git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "p3kv").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "p3kv" / "core.py").write_text("x = 1\n")
    (root / "benchmarks" / "results" / "rows.csv").write_text("a,b\n")
    os.symlink("core.py", root / "p3kv" / "alias.py")
    git(root, "init", "-q")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    return root


def test_git_and_the_manifest_hash_files_alike(repo):
    assert tree_manifest.blob_hash(repo / "p3kv" / "core.py") == git(repo, "hash-object", "p3kv/core.py")
    listed = git(repo, "ls-files", "-s", "p3kv/alias.py").split()
    assert listed[0] == "120000" and tree_manifest.blob_hash(repo / "p3kv" / "alias.py") == listed[1]


def test_a_copy_without_its_git_is_the_manifests_commit_until_a_file_changes(repo, tmp_path, monkeypatch):
    manifest = tmp_path / "manifest"
    commit = tree_manifest.write(manifest, repo)
    assert commit == git(repo, "rev-parse", "HEAD")
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setenv(tree_manifest.VARIABLE, str(manifest))
    assert run_guard.git_state(copy) == (commit, False)
    (copy / "benchmarks" / "results" / "rows.csv").write_text("a,b\n1,2\n")  # a benchmark's own output: still clean
    assert run_guard.git_state(copy) == (commit, False)
    (copy / "p3kv" / "core.py").write_text("x = 2\n")
    assert run_guard.git_state(copy) == (commit, True)
    assert tree_manifest.check(manifest, copy, run_guard.OUTPUTS) == (commit, ["p3kv/core.py"])
    (copy / "p3kv" / "core.py").unlink()
    assert tree_manifest.check(manifest, copy, run_guard.OUTPUTS)[1] == ["p3kv/core.py"]  # missing counts too


def test_a_manifest_is_written_only_for_a_committed_tree_and_read_only_when_it_is_one(repo, tmp_path):
    (repo / "p3kv" / "core.py").write_text("x = 3\n")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        tree_manifest.write(tmp_path / "manifest", repo)
    bad = tmp_path / "bad"
    bad.write_text("100644 abc 0\tp3kv/core.py\n")
    with pytest.raises(ValueError, match="not a tree manifest"):
        tree_manifest.check(bad, repo)

"""`import p3kv` from a folder whose C++ core is not built (the README's `pip install .`, then its examples run
from the checkout: the source folder shadows the installed package) fails with a message that says what to do."""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from harness import ROOT

pytestmark = pytest.mark.unit


def copy_without_core(dest):
    shutil.copytree(f"{ROOT}/p3kv", dest / "p3kv", ignore=shutil.ignore_patterns("_p3*.so", "__pycache__"))


def import_in(cwd, code, pythonpath=""):
    """Runs `code` in a fresh interpreter without site-packages (-S): the test's own p3kv may be installed in
    editable mode there, and its finder would supply the core."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_missing_core_says_to_build_it(tmp_path):
    copy_without_core(tmp_path)
    result = import_in(tmp_path, "import p3kv, p3kv.core.node")
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: cannot import p3kv's C++ core: p3kv's C++ core (p3kv/_p3*.so) is not "
                              f"built in {tmp_path / 'p3kv'}"), message
    assert "pip install -e ." in message and "python setup.py build_ext --inplace" in message, message
    # `import p3kv` alone stays cheap and works (the core is imported when a node is created).
    assert import_in(tmp_path, "import p3kv; print(p3kv.__version__)").returncode == 0


def test_source_folder_shadowing_an_installed_p3kv_is_named(tmp_path):
    (tmp_path / "checkout").mkdir()
    copy_without_core(tmp_path / "checkout")
    installed = tmp_path / "site-packages"
    copy_without_core(installed)
    (installed / "p3kv" / "_p3.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # only its name matters here
    result = import_in(tmp_path / "checkout", "from p3kv import _p3", pythonpath=str(installed))
    message = result.stderr.strip().splitlines()[-1]
    assert f"shadows the installed p3kv at {installed / 'p3kv'}" in message, message
    assert "Run from another directory" in message and "python setup.py build_ext --inplace" in message, message


CORE_MODULES = ("config", "keys", "node", "worker", "server", "scheduler", "requests", "native_optimizer")


def run_here(code):
    """Runs `code` in a fresh interpreter that imports this checkout's p3kv (with its built core)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_core_loads_no_mxnet():
    core = ", ".join(f"p3kv.core.{m}" for m in CORE_MODULES)
    result = run_here(f"import sys, p3kv, p3kv.core.errors, {core}\nfrom p3kv import P3Server, P3Worker, _p3\n"
                      "assert P3Worker.__module__ == 'p3kv.core.worker' and P3Server.__module__ == 'p3kv.core.server'\n"
                      "loaded = sorted(m for m in sys.modules if m == 'mxnet' or m.startswith('mxnet.'))\n"
                      "print('mxnet modules:', loaded)\n"
                      "print('p3kv from', p3kv.__file__)")
    assert result.returncode == 0, result.stderr
    assert "mxnet modules: []" in result.stdout, result.stdout
    assert f"p3kv from {ROOT}/p3kv/__init__.py" in result.stdout, result.stdout


@pytest.mark.parametrize("first", ["mxnet", "p3kv"])
def test_kvstore_p3_is_registered_whichever_is_imported_first(first):
    second = "p3kv" if first == "mxnet" else "mxnet"
    result = run_here(f"import {first}, {second}\nimport mxnet as mx\n"
                      "from p3kv.mxnet.kvstore import P3\n"
                      "print('registered:', mx.kvstore.KVStoreBase.kv_registry.get('p3') is P3)")
    assert result.returncode == 0, result.stderr
    assert "registered: True" in result.stdout, result.stdout


def test_the_core_imports_nothing_from_the_layers_above_it():
    # Every import statement, function-level ones too: a lazy import of p3kv.mxnet from the core is still a
    # dependency on the MXNet layer (the default server used to reach up for the optimizer host this way).
    above = []
    for path in sorted(pathlib.Path(ROOT, "p3kv", "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            above += [f"{path.name}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("mxnet", "torch") or n.startswith(("p3kv.mxnet", "p3kv.torch",
                                                                                    "p3kv.launch"))]
    assert above == []


def test_the_launchers_server_runs_the_mxnet_optimizer_and_the_core_server_framework_free_kernels():
    result = run_here("from p3kv.core.config import load, Role\n"
                      "from p3kv.core.server import P3Server\n"
                      "from p3kv.mxnet.server import OptimizerServer\n"
                      "config = load(role=Role.SERVER, root_uri='127.0.0.1', root_port=9, num_worker=1, num_server=1)\n"
                      "plain, mx_server = P3Server(config), OptimizerServer(config)\n"
                      "print('plain host:', type(plain.optimizer_host).__name__)\n"
                      "print('optimizer host:', type(mx_server.optimizer_host).__name__)\n"
                      "import sys; print('mxnet loaded:', 'mxnet' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert "plain host: NativeOptimizerHost" in result.stdout and "optimizer host: OptimizerHost" in result.stdout, \
        result.stdout
    assert "mxnet loaded: False" in result.stdout, result.stdout  # imported only when an optimizer arrives


def test_the_launchers_server_imports_mxnet_in_the_background_at_start():
    # Done before worker 0's optimizer arrives, so the first step does not wait for 4 servers importing it at once.
    result = run_here("import sys\nfrom p3kv.mxnet.server import preload_mxnet\n"
                      "print('mxnet before:', 'mxnet' in sys.modules)\n"
                      "thread = preload_mxnet()\nthread.join(120)\n"
                      "print('mxnet after:', 'mxnet' in sys.modules, thread.name)\n"
                      "import importlib.util\nimportlib.util.find_spec = lambda name, *a: None\n"
                      "print('without mxnet:', preload_mxnet())")
    assert result.returncode == 0, result.stderr
    assert "mxnet before: False" in result.stdout and "mxnet after: True import mxnet" in result.stdout, result.stdout
    assert "without mxnet: None" in result.stdout, result.stdout


@pytest.mark.parametrize("value,preloads", [("", True), ("1", True), ("0", False), ("yes", False)])
def test_the_server_preloads_mxnet_unless_told_not_to(monkeypatch, value, preloads):
    # A server that only sums never needs mxnet: P3_PRELOAD_MXNET=0 saves its import. A bad value does not preload;
    # the config load in serve() reports it.
    from p3kv.mxnet import server
    calls = []
    monkeypatch.setenv("P3_PRELOAD_MXNET", value)
    monkeypatch.setattr(server, "preload_mxnet", lambda: calls.append("preload"))
    monkeypatch.setattr(server, "serve", lambda create: 0)
    assert server.main() == 0
    assert calls == (["preload"] if preloads else [])

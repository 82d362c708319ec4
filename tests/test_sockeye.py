"""Sockeye 2.3 (the last MXNet Sockeye) trains a tiny transformer with kvstore 'p3' through the launcher.

Two workers see the same batches and average their gradients (rescale_grad 0.5), so the job must follow the
single-process run of kvstore 'device' exactly, checkpoint by checkpoint: through Sockeye's plateau learning-rate
reductions (which reload the best optimizer states) and through a resumed run (update counts restored).
"""

import filecmp
import importlib.util
import math
import os
import random
import re
import subprocess
import sys

import pytest
from harness import ROOT, run_job

pytestmark = pytest.mark.mxnet

if importlib.util.find_spec("sockeye") is None:
    pytest.skip("sockeye is not installed: `make setup` installs it (pip install --no-deps sockeye==2.3.24 and "
                "pip install -e '.[sockeye]')", allow_module_level=True)

FIRST_UPDATES = 8  # a learning-rate reduction happens at checkpoint 7 with the settings below
RESUMED_UPDATES = 10

MODEL = ["--encoder", "transformer", "--decoder", "transformer", "--num-layers", "1",
         "--transformer-model-size", "16", "--transformer-attention-heads", "2",
         "--transformer-feed-forward-num-hidden", "32", "--num-embed", "16", "--shared-vocab"]
TRAINING = ["--use-cpu", "--disable-device-locking", "--seed", "1", "--batch-type", "sentence", "--batch-size", "16",
            "--max-seq-len", "12", "--checkpoint-interval", "1", "--decode-and-evaluate", "0",
            "--initial-learning-rate", "0.1", "--learning-rate-reduce-num-not-improved", "1",
            "--learning-rate-reduce-factor", "0.1", "--max-num-checkpoint-not-improved", "50"]


def write_corpus(folder):
    """A reversal task: 200 training and 20 validation pairs of random token sequences."""
    rng = random.Random(7)
    files = {}
    for split, lines in (("train", 200), ("dev", 20)):
        src, trg = folder / f"{split}.src", folder / f"{split}.trg"
        with open(src, "w") as s, open(trg, "w") as t:
            for _ in range(lines):
                tokens = [f"w{rng.randrange(20)}" for _ in range(rng.randint(3, 10))]
                s.write(" ".join(tokens) + "\n")
                t.write(" ".join(reversed(tokens)) + "\n")
        files[split] = (str(src), str(trg))
    return ["-s", files["train"][0], "-t", files["train"][1], "-vs", files["dev"][0], "-vt", files["dev"][1]]


def read_metrics(folder):
    """Sockeye's per-checkpoint metrics file: [(checkpoint, learning rate, train ppl, validation ppl)]."""
    rows = []
    with open(os.path.join(folder, "metrics")) as f:
        for line in f:
            checkpoint, *items = line.rstrip("\n").split("\t")
            fields = dict(item.split("=", 1) for item in items)
            rows.append((int(checkpoint), float(fields["learning-rate"]), float(fields["perplexity-train"]),
                         float(fields["perplexity-val"])))
    return rows


def assert_same_metrics(got, want, who):
    assert [r[0] for r in got] == [r[0] for r in want], f"{who}: checkpoints differ"
    for g, w in zip(got, want):
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(g[1:], w[1:])), \
            f"{who} at checkpoint {g[0]}: (lr, train ppl, val ppl) {g[1:]} != single process {w[1:]}"


def train_reference(args, output, updates):
    cmd = [sys.executable, "-m", "p3kv.mxnet.sockeye_train", *args, "--kvstore", "device", "-o", output,
           "--max-updates", str(updates)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:]


def train_p3(args, output, updates):
    job = run_job(2, 2, ["-m", "p3kv.mxnet.sockeye_train", *args, "--kvstore", "p3", "--optimizer-params",
                         "rescale_grad:0.5", "-o", output, "--max-updates", str(updates)],
                  timeout=180, launcher_args=("--timeout", "150"))
    assert job.returncode == 0, job.stdout[-6000:]
    for worker in (0, 1):
        assert re.search(rf"^\[worker {worker}\] .*Checkpoint \[{updates}\]\tUpdates={updates} ", job.stdout, re.M), \
            f"worker {worker} did not reach update {updates}:\n{job.stdout[-4000:]}"
    return job


def assert_workers_agree(output, checkpoint):
    """Both workers saved the same parameters (MXNet's file format is deterministic: compare the bytes)."""
    name = f"params.{checkpoint:05d}"
    assert filecmp.cmp(os.path.join(output, name), os.path.join(output, "secondary_workers", "1", name),
                       shallow=False), f"the workers' {name} differ"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A p3 job (2 workers x 2 servers) and the single-process reference, FIRST_UPDATES updates each."""
    folder = tmp_path_factory.mktemp("sockeye")
    args = [*write_corpus(folder), *MODEL, *TRAINING]
    reference, p3 = str(folder / "reference"), str(folder / "p3")
    train_reference(args, reference, FIRST_UPDATES)
    job = train_p3(args, p3, FIRST_UPDATES)
    return args, reference, p3, job


def test_sockeye_trains_with_p3(trained):
    _, reference, p3, job = trained
    assert "Loading model parameters and optimizer states from best checkpoint" in job.stdout, \
        "the settings no longer trigger a learning-rate reduction: the test lost its point"
    for folder in (p3, os.path.join(p3, "secondary_workers", "1")):
        for name in ("config", "args.yaml", "vocab.src.0.json", "params.best", f"params.{FIRST_UPDATES:05d}",
                     "mx_optimizer_best.pkl", os.path.join("training_state", "mx_optimizer_last.pkl")):
            assert os.path.exists(os.path.join(folder, name)), f"{folder} lacks {name}"
    assert_workers_agree(p3, FIRST_UPDATES)
    want = read_metrics(reference)
    assert_same_metrics(read_metrics(p3), want, "rank 0")
    assert_same_metrics(read_metrics(os.path.join(p3, "secondary_workers", "1")), want, "rank 1")


def test_sockeye_resumes_with_p3(trained):
    args, reference, p3, _ = trained
    train_reference(args, reference, RESUMED_UPDATES)
    job = train_p3(args, p3, RESUMED_UPDATES)
    assert "Resuming from saved state" in job.stdout
    assert_workers_agree(p3, RESUMED_UPDATES)
    assert_same_metrics(read_metrics(p3), read_metrics(reference), "rank 0 after resuming")

"""The real models of the cluster benchmark's `real` compute mode, and the networks make_shapes.py profiles.

    m = real_models.build("resnet50_v1", batch_size=32, ctx=mx.cpu())
    with autograd.record():
        L = m.loss(*m.batch())
    L.backward()
    trainer.step(m.batch_size)

Models: the gluoncv image classifiers resnet50_v1, vgg19 and inceptionv3 (random init, 1000 classes) and
"sockeye", a Sockeye 2.3 transformer built the way `sockeye.train` builds it (SOCKEYE_MODEL_ARGS). Every batch is
synthetic, drawn once from a fixed seed. gluoncv and sockeye are imported only when one of their models is
built, so importing this module needs mxnet alone.

The networks are used as their own training scripts use them: hybridized (Sockeye and gluoncv's training
scripts both do), parameters read in the order their forward pass reads them. p3kv's kvstore learns its
priorities from those reads, so nothing here reorders anything.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from typing import Callable

import mxnet as mx
import numpy as np

LOG = logging.getLogger("real_models")

GLUONCV_MODELS = ("resnet50_v1", "vgg19", "inceptionv3")
SOCKEYE = "sockeye"
MODELS = (*GLUONCV_MODELS, SOCKEYE)
IMAGE_SIZE = {"inceptionv3": 299}  # every other image model takes 224 x 224 images
NUM_CLASSES = 1000
SEED = 7

# The Sockeye model: an IWSLT'15 English-Vietnamese transformer. The vocabularies are the sizes of that data
# set's usual word vocabularies (Luong & Manning 2015: 17,191 English, 7,709 Vietnamese words). Separate
# vocabularies rule out Sockeye's default weight tying (src_trg_softmax, which forces a joint vocabulary), so
# the model ties what it still can, the target embedding and the output layer (trg_softmax). That also keeps
# every gradient dense: Sockeye gives untied embeddings row_sparse gradients, which parameter-server
# kvstores handle differently from dense ones. Every other setting is Sockeye 2.3.24's default, spelled out.
SOURCE_VOCAB = 17_191
TARGET_VOCAB = 7_709
SEQ_LEN = 50  # source and target tokens per sentence, no padding: the FLOPs and the timing use full sentences
SOCKEYE_MODEL_ARGS = [
    "--encoder", "transformer", "--decoder", "transformer", "--num-layers", "6:6",
    "--transformer-model-size", "512", "--transformer-attention-heads", "8",
    "--transformer-feed-forward-num-hidden", "2048", "--weight-tying-type", "trg_softmax",
    "--max-seq-len", f"{SEQ_LEN}:{SEQ_LEN}",
]


class RealModel:
    """One model with its synthetic batch and loss, for `batch_size` samples on one context.

    `batch()` returns the net's inputs followed by the label (always last); `loss(*batch)` runs the forward
    pass and the loss (call it inside autograd.record()); `samples_per_batch` counts images, or target tokens
    for Sockeye. Single-threaded: one training loop uses it.
    """

    def __init__(self, name: str, net: mx.gluon.Block, batch: tuple, loss: Callable, batch_size: int,
                 samples_per_batch: int):
        self.name = name
        self.net = net
        self.batch_size = batch_size
        self.samples_per_batch = samples_per_batch
        self._batch = batch
        self._loss = loss

    def batch(self) -> tuple:
        return self._batch

    def loss(self, *batch) -> mx.nd.NDArray:
        *inputs, label = batch
        return self._loss(self.net(*inputs), label)


def build(model: str, batch_size: int, ctx: mx.Context, *, hybridize: bool = True) -> RealModel:
    """The initialized model; every parameter has its shape and value (one forward pass has run)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1 (got {batch_size})")
    if model in GLUONCV_MODELS:
        real = _gluoncv(model, batch_size, ctx)
    elif model == SOCKEYE:
        real = _sockeye(batch_size, ctx)
    else:
        raise ValueError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
    if hybridize:
        real.net.hybridize(static_alloc=True)
    # Gluon defers the initialization of parameters whose shape depends on the input (gluoncv's layers leave
    # in_channels open) to the first forward pass; a kvstore needs the arrays before training starts.
    real.net(*real.batch()[:-1])
    mx.nd.waitall()
    return real


def _gluoncv_model_zoo():
    """gluoncv's model zoo. gluoncv 0.10's own import raises RuntimeError when torch 2.x is importable beside it
    (its check wants torch<2 for a PyTorch half p3kv never uses, and the `test` extra installs torch for
    p3kv.torch): it is imported with torch hidden for that moment (even where torch is loaded already, as in a
    test session that also runs the torch tests), so gluoncv sees MXNet only."""
    import importlib
    import sys

    if "gluoncv" in sys.modules:
        return importlib.import_module("gluoncv.model_zoo")
    missing = object()
    loaded = sys.modules.get("torch", missing)
    sys.modules["torch"] = None  # `import torch` raises ImportError: gluoncv's "no PyTorch" path
    try:
        return importlib.import_module("gluoncv.model_zoo")
    finally:
        if loaded is missing:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = loaded


def _gluoncv(model: str, batch_size: int, ctx: mx.Context) -> RealModel:
    net = _gluoncv_model_zoo().get_model(model, pretrained=False, classes=NUM_CLASSES)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    size = IMAGE_SIZE.get(model, 224)
    rng = np.random.RandomState(SEED)
    images = mx.nd.array(rng.uniform(-1, 1, (batch_size, 3, size, size)), ctx=ctx)
    labels = mx.nd.array(rng.randint(0, NUM_CLASSES, batch_size), ctx=ctx)
    cross_entropy = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    return RealModel(model, net, (images, labels), cross_entropy, batch_size, batch_size)


def sockeye_args() -> argparse.Namespace:
    """sockeye.train's arguments for the benchmark's transformer (SOCKEYE_MODEL_ARGS, defaults elsewhere)."""
    import sockeye.arguments

    parser = argparse.ArgumentParser()
    sockeye.arguments.add_train_cli_args(parser)
    # The parser insists that the data files exist; building the model never reads them.
    with tempfile.NamedTemporaryFile() as placeholder:
        files = ["--source", placeholder.name, "--target", placeholder.name, "--validation-source",
                 placeholder.name, "--validation-target", placeholder.name, "--output", "unused"]
        return parser.parse_args(files + SOCKEYE_MODEL_ARGS)


def _sockeye(batch_size: int, ctx: mx.Context) -> RealModel:
    import sockeye.constants as C
    import sockeye.data_io
    import sockeye.loss
    import sockeye.model
    import sockeye.train

    args = sockeye_args()
    # What sockeye.train.train does between parsing and building: maximum lengths make room for <bos>/<eos>;
    # the data statistics only matter for checkpoints and length prediction (off).
    max_len_source, max_len_target = (length + C.SPACE_FOR_XOS for length in args.max_seq_len)
    statistics = sockeye.data_io.DataStatistics(
        num_sents=0, num_discarded=0, num_tokens_source=0, num_tokens_target=0, num_unks_source=0,
        num_unks_target=0, max_observed_len_source=SEQ_LEN, max_observed_len_target=SEQ_LEN,
        size_vocab_source=SOURCE_VOCAB, size_vocab_target=TARGET_VOCAB, length_ratio_mean=1.0,
        length_ratio_std=0.0, buckets=[(SEQ_LEN, SEQ_LEN)], num_sents_per_bucket=[0],
        average_len_target_per_bucket=[None])
    config_data = sockeye.data_io.DataConfig(data_statistics=statistics, max_seq_len_source=max_len_source,
                                             max_seq_len_target=max_len_target, num_source_factors=1,
                                             num_target_factors=1)
    config = sockeye.train.create_model_config(args, [SOURCE_VOCAB], [TARGET_VOCAB], max_len_source,
                                               max_len_target, config_data)
    net = sockeye.model.SockeyeModel(config)
    net.initialize(sockeye.train.create_optimizer_config(args).initializer, ctx=ctx)

    # Sockeye's batches: (batch, length, factors) token ids as float32, lengths, and the labels, i.e. the
    # target shifted by one. Ids 0-3 are <pad>, <unk>, <bos>, <eos>.
    rng = np.random.RandomState(SEED)
    first_word = len(C.VOCAB_SYMBOLS)
    source = rng.randint(first_word, SOURCE_VOCAB, (batch_size, SEQ_LEN, 1))
    labels = rng.randint(first_word, TARGET_VOCAB, (batch_size, SEQ_LEN))
    target = np.concatenate([np.full((batch_size, 1), C.BOS_ID), labels[:, :-1]], axis=1)[:, :, None]
    lengths = np.full((batch_size,), SEQ_LEN)
    batch = tuple(mx.nd.array(a, ctx=ctx, dtype="float32") for a in (source, lengths, target, lengths, labels))

    # Sockeye's default loss returns the cross-entropy averaged over target tokens and Sockeye calls
    # trainer.step(1); weighting it by the batch size makes the runner's trainer.step(batch_size) the same update.
    if args.loss != C.CROSS_ENTROPY_WITOUT_SOFTMAX_OUTPUT:
        raise RuntimeError(f"Sockeye's default loss is {args.loss!r}; real_models expects "
                           f"{C.CROSS_ENTROPY_WITOUT_SOFTMAX_OUTPUT!r}")
    cross_entropy = sockeye.loss.CrossEntropyLossWithoutSoftmaxOutput(
        weight=float(batch_size), label_smoothing=args.label_smoothing, num_labels=TARGET_VOCAB)
    cross_entropy.hybridize(static_alloc=True)

    def loss(outputs: dict, label: mx.nd.NDArray) -> mx.nd.NDArray:
        value, _ = cross_entropy(outputs, {C.TARGET_LABEL_NAME: label})
        return value

    return RealModel(SOCKEYE, net, batch, loss, batch_size, batch_size * SEQ_LEN)

"""The cluster benchmark's model descriptions: the per-layer profiles of benchmarks/workloads/shapes/*.json and the real
models of benchmarks/workloads/real_models.py (needs mxnet and gluoncv; no network, no GPU)."""

import json
import os

import mxnet as mx
import pytest

from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import real_models

SHAPES = str(SHAPES_DIR)
# Forward FLOPs per sample. Published: ResNet-50 v1 (stride in the 1x1 convolutions) 3.9 G multiply-adds,
# VGG-19 19.6 G, Inception-v3 5.7 G at 299 px. The transformer (50 + 50 tokens): 2 FLOPs per weight and token
# (encoder 18.9 M weights x 50 source tokens, decoder 25.2 M and output layer 3.9 M x 50 target tokens) plus
# attention, 4.9 G.
FLOPS_RANGE = {"resnet50_v1": (7.7e9, 8.2e9), "vgg19": (38.5e9, 40e9), "inceptionv3": (11.2e9, 11.8e9),
               "sockeye": (4.7e9, 5.1e9)}


def load(model):
    with open(os.path.join(SHAPES, f"{model}.json")) as f:
        return json.load(f)


@pytest.mark.unit
def test_every_model_has_a_shape_file():
    assert sorted(f[:-5] for f in os.listdir(SHAPES) if f.endswith(".json")) == sorted(real_models.MODELS)


@pytest.mark.unit
@pytest.mark.parametrize("model", real_models.MODELS)
def test_layers_cover_every_parameter_once_in_order(model):
    description = load(model)
    layers = description["layers"]
    assert [i for layer in layers for i in layer["params"]] == list(range(len(description["params"])))
    assert all(layer["params"] for layer in layers)
    assert len({layer["name"] for layer in layers}) == len(layers) == description["num_layers"]
    assert all(isinstance(layer["fwd_flops"], int) and layer["fwd_flops"] >= 0 for layer in layers)
    assert sum(layer["fwd_flops"] for layer in layers) == description["fwd_flops_total"]
    assert description["flops_ignored"] == []


@pytest.mark.unit
@pytest.mark.parametrize("model", real_models.MODELS)
def test_forward_flops_per_sample(model):
    description = load(model)
    low, high = FLOPS_RANGE[model]
    assert low <= description["fwd_flops_total"] <= high
    if model == real_models.SOCKEYE:
        assert (description["sample_unit"], description["tokens_per_sample"]) == ("tokens", real_models.SEQ_LEN)
    else:
        assert description["sample_unit"] == "images"


@pytest.mark.unit
def test_sockeye_target_embedding_comes_right_before_the_decoder():
    names = [layer["name"] for layer in load("sockeye")["layers"]]
    at = names.index("target_embed")
    assert names[0] == "source_embed"
    assert names[at - 1].startswith("encoder_transformer") and names[at + 1].startswith("decoder_transformer")
    assert names[-1] == "target_output"


@pytest.mark.mxnet
def test_real_resnet50_trains_in_shape_file_order(monkeypatch):
    """One forward/backward of the real model gives every parameter a gradient of its shape, and the forward
    pass reads the parameters in the order of the shape file (what p3kv's kvstore learns its priorities from)."""
    model = real_models.build("resnet50_v1", 1, mx.cpu())
    reads = []
    data = mx.gluon.Parameter.data

    def recording_data(param, ctx=None):
        if param.grad_req != "null" and param.name not in reads:
            reads.append(param.name)
        return data(param, ctx)

    monkeypatch.setattr(mx.gluon.Parameter, "data", recording_data)
    with mx.autograd.record():
        loss = model.loss(*model.batch())
    loss.backward()
    monkeypatch.undo()

    entries = load("resnet50_v1")["params"]
    assert reads == [entry["name"] for entry in entries]
    assert model.samples_per_batch == model.batch_size == 1
    params = model.net.collect_params()
    for entry in entries:
        grad = params[entry["name"]].grad()
        assert list(grad.shape) == entry["shape"]
    assert all(params[entry["name"]].grad().abs().sum().asscalar() > 0 for entry in entries[-4:])

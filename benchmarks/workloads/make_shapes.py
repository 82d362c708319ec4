"""Write each benchmark model's trainable parameters and per-layer forward FLOPs to
benchmarks/workloads/shapes/<model>.json.

The transport benchmark only needs each array's name, shape and dtype, and the emulated compute mode only each
layer's parameters and FLOPs, so the JSON files are committed and the benchmarks run without gluoncv or
sockeye. The networks are real_models.py's (gluoncv's resnet50_v1, vgg19, inceptionv3; a Sockeye 2.3
transformer). Regenerate with::

    pip install -e '.[bench,sockeye]' && pip install --no-deps gluoncv==0.10.5.post0 sockeye==2.3.24
    python -m benchmarks.workloads.make_shapes --models resnet50_v1 vgg19 inceptionv3 sockeye

Forward order matters: P3 gives every array the priority of its layer in forward order (first layer most
urgent). It is the order in which one imperative forward pass first reads each parameter (Parameter.data(),
which p3kv's kvstore watches too), checked against the order in which the layers owning them run and, for
HybridBlocks, against the symbolic graph (``list_arguments()``, a topological order); they must agree or the
script fails. One exception, Sockeye (DEFERRED_LAYERS): it embeds the target sentence before running the
encoder, but only the decoder uses that embedding, so the target embedding is placed right before the
decoder, where the data flow first needs it; the emulated compute mode chains layers one after the other and
would otherwise make the whole encoder wait for the target embedding's weights.

Layers ("layers"): one per block that owns trainable parameters no block below it owns (a leaf, or e.g. a
Conv2D with its activation as a child), in the order they run; a parameter shared by several blocks (Sockeye's
target embedding, tied to the output layer) belongs to the first. "fwd_flops" is forward FLOPs for one sample
at batch 1, a multiply-add counting 2, from the shapes seen by forward hooks:
- Conv2D 2*Cin/groups*kh*kw per output element (+1 with bias); Dense, Sockeye's QuantizableDense and
  OutputLayer 2*in per output element (+1 with bias); BatchNorm, LayerNorm NORM_FLOPS per output element;
  embeddings 0 (a lookup).
- Blocks without trainable parameters add their FLOPs to the next layer that has some (to the last layer if
  none follows): activations and dropout 1 per output element, pooling the window size per output element
  (global pooling 1 per input element), Sockeye's attention (DotAttentionCell: 2*2*Lq*Lk*d for the two batched
  matmuls plus SOFTMAX_FLOPS per attention logit), its residual and dropout steps (1 per element each) and its
  positional embeddings (2 per element). Blocks of other types count 0 and are listed in "flops_ignored".
- Operators written inline in a block that has child blocks are not seen by hooks and are ignored: ResNet's
  residual additions and the ReLU after them, Inception's concatenations (together well under 1%).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import math
import pathlib
import sys

import mxnet as mx
import numpy as np

from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import real_models

LOG = logging.getLogger("make_shapes")
NORM_FLOPS = 5  # per element: mean, variance, normalize, scale, shift
SOFTMAX_FLOPS = 5  # per element: max, subtract, exp, sum, divide
# model -> {layer name: name prefix of the first layer that uses its output}; see the module docstring.
DEFERRED_LAYERS = {real_models.SOCKEYE: {"target_embed": "decoder_transformer"}}


def _first_array(value):
    if isinstance(value, mx.nd.NDArray):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            array = _first_array(item)
            if array is not None:
                return array
    return None


def _matmul(block, inputs, out) -> int:
    """Conv2D, Dense and the like: each output element is a dot product over the weight's fan-in."""
    fan_in = math.prod(block._reg_params["weight"].shape[1:])
    bias = block._reg_params.get("bias")
    return out.size * (2 * fan_in + (1 if bias is not None else 0))


def _pooling(block, inputs, out) -> int:
    if block._kwargs.get("global_pool"):
        return _first_array(inputs).size
    return out.size * math.prod(block._kwargs["kernel"])


def _dot_attention(block, inputs, out) -> int:
    # Sockeye's interleaved layout: queries (Lq, batch, d), keys and values (Lk, batch, 2d), heads.
    queries, key_values, heads = inputs[0], inputs[1], inputs[2]
    length_q, batch, depth = queries.shape
    length_k = key_values.shape[0]
    logits = batch * heads * length_q * length_k
    return 2 * 2 * batch * length_q * length_k * depth + SOFTMAX_FLOPS * logits


def _process(block, inputs, out) -> int:
    # Sockeye's TransformerProcessBlock: 'r' residual add, 'd' dropout if any ('n' is a LayerNorm child, hooked
    # itself).
    return out.size * sum(step == "r" or (step == "d" and block.dropout > 0) for step in block.sequence)


FLOP_RULES = {  # class name (or a base class's) -> FLOPs of one call
    "Conv2D": _matmul, "Dense": _matmul, "QuantizableDense": _matmul, "OutputLayer": _matmul,
    "BatchNorm": lambda block, inputs, out: NORM_FLOPS * out.size,
    "LayerNorm": lambda block, inputs, out: NORM_FLOPS * out.size,
    "Embedding": lambda block, inputs, out: 0,
    "Activation": lambda block, inputs, out: out.size,
    "Dropout": lambda block, inputs, out: out.size,
    "MaxPool2D": _pooling, "AvgPool2D": _pooling, "GlobalAvgPool2D": _pooling, "GlobalMaxPool2D": _pooling,
    "Flatten": lambda block, inputs, out: 0,
    "DotAttentionCell": _dot_attention,
    "TransformerProcessBlock": _process,
    "PositionalEmbeddings": lambda block, inputs, out: 2 * out.size,
    "AutoRegressiveBias": lambda block, inputs, out: 0,
}


def _rule(block):
    for cls in type(block).__mro__:
        if cls.__name__ in FLOP_RULES:
            return FLOP_RULES[cls.__name__]
    return None


def _trainable(block) -> list:
    return [p for p in block._reg_params.values() if p.grad_req != "null"]


def _units(net) -> dict:
    """id(block) -> (block, the trainable parameters it owns): the blocks to hook (leaves and owners)."""
    units: dict = {}

    def visit(block) -> set:
        below: set = set()
        for child in block._children.values():
            below |= visit(child)
        own = [p for p in _trainable(block) if p.name not in below]
        if own or not block._children:
            units[id(block)] = (block, own)
        return below | {p.name for p in _trainable(block)}

    visit(net)
    return units


def run_forward(net, inputs) -> tuple[list, list[str]]:
    """One imperative forward pass: the calls of the hooked blocks in the order they start (dicts with block,
    own params and FLOPs) and the trainable parameters in the order Parameter.data() first reads them."""
    calls: list = []
    stack: list = []
    handles = []

    def pre(block, _inputs):
        stack.append(len(calls))
        calls.append({"block": block, "own": units[id(block)][1], "flops": 0})

    def post(block, inputs, outputs):
        call = calls[stack.pop()]
        rule = _rule(block)
        call["flops"] = rule(block, inputs, _first_array(outputs)) if rule else None

    units = _units(net)
    for block, _ in units.values():
        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    reads: dict = {}
    data = mx.gluon.Parameter.data

    def recording_data(param, ctx=None):
        if param.grad_req != "null":
            reads.setdefault(param.name, None)
        return data(param, ctx)

    mx.gluon.Parameter.data = recording_data
    try:
        net(*inputs)
        mx.nd.waitall()
    finally:
        mx.gluon.Parameter.data = data
        for handle in handles:
            handle.detach()
    return calls, list(reads)


def _layer_name(block, param) -> str:
    # Sockeye names some blocks by a suffix only (12 blocks are "att_self_h2o"); their parameters carry the
    # full prefix.
    if param.name.startswith(block.name):
        return block.name
    key = next(k for k, p in block._reg_params.items() if p is param)
    return param.name[:-len(key)].rstrip("_")


def group_layers(calls: list) -> tuple[list[dict], list[str]]:
    """Layers in the order they run (FLOPs of parameter-less blocks moved to the next layer), and the type
    names of the blocks no FLOP rule covers."""
    layers: list[dict] = []
    layer_of: dict = {}
    owned: set = set()
    ignored: set = set()
    pending = 0
    for call in calls:
        block, flops = call["block"], call["flops"]
        if flops is None:
            ignored.add(type(block).__name__)
            flops = 0
        new = [p for p in call["own"] if p.name not in owned]
        if new:
            layer = {"name": _layer_name(block, new[0]), "params": [p.name for p in new], "fwd_flops": flops + pending}
            layers.append(layer)
            layer_of[id(block)] = layer
            owned.update(p.name for p in new)
            pending = 0
        elif id(block) in layer_of:  # a layer called again
            layer_of[id(block)]["fwd_flops"] += flops
        else:
            pending += flops
    if not layers:
        raise SystemExit("the network has no trainable parameters")
    layers[-1]["fwd_flops"] += pending
    return layers, sorted(ignored)


def defer(model: str, layers: list[dict]) -> list[dict]:
    """Moves each of DEFERRED_LAYERS[model] right before the first layer that uses its output."""
    for name, user in DEFERRED_LAYERS.get(model, {}).items():
        moved = [layer for layer in layers if layer["name"] == name]
        if len(moved) != 1:
            raise SystemExit(f"{model}: expected one layer {name!r} to move, found {len(moved)}")
        layers = [layer for layer in layers if layer is not moved[0]]
        at = next((k for k, layer in enumerate(layers) if layer["name"].startswith(user)), None)
        if at is None:
            raise SystemExit(f"{model}: no layer {user}* to move {name!r} before")
        layers.insert(at, moved[0])
    return layers


def check_layers(description: dict) -> None:
    """Every parameter in exactly one layer, layers in params order; fails otherwise."""
    indices = [i for layer in description["layers"] for i in layer["params"]]
    if indices != list(range(len(description["params"]))):
        raise SystemExit(f"{description['model']}: the layers do not list the parameters once each in params "
                         "order")


def describe(model: str) -> dict:
    LOG.info("building %s", model)
    real = real_models.build(model, 1, mx.cpu(), hybridize=False)
    net, inputs = real.net, real.batch()[:-1]
    calls, reads = run_forward(net, inputs)
    layers, ignored = group_layers(calls)
    params = net.collect_params()
    trainable = {name for name, p in params.items() if p.grad_req != "null"}
    in_layers = [name for layer in layers for name in layer["params"]]
    if in_layers != reads:
        raise SystemExit(f"{model}: the order in which layers run and the order of parameter reads disagree")
    if set(reads) != trainable:
        raise SystemExit(f"{model}: the forward pass does not read exactly the trainable parameters")
    if isinstance(net, mx.gluon.HybridBlock):
        symbolic = [name for name in net(mx.sym.var("data")).list_arguments() if name != "data"]
        if symbolic != reads:
            raise SystemExit(f"{model}: symbolic argument order and imperative forward order disagree")
        order = "forward (first reads in one imperative forward pass, checked against symbol list_arguments)"
    else:
        order = "forward (first reads in one imperative forward pass; the target embedding placed before the " \
                "decoder, the first layer that uses it)"
    layers = defer(model, layers)
    names = [name for layer in layers for name in layer["params"]]
    index = {name: i for i, name in enumerate(names)}
    for layer in layers:
        layer["params"] = [index[name] for name in layer["params"]]
    entries = [{"name": n, "shape": list(params[n].shape), "dtype": np.dtype(params[n].dtype).name} for n in names]
    sizes = [params[n].data().size for n in names]
    versions = {"mxnet": mx.__version__}
    if model == real_models.SOCKEYE:
        versions = {"sockeye": importlib.metadata.version("sockeye"), **versions}
        sample = {"sample_unit": "tokens", "tokens_per_sample": real_models.SEQ_LEN,
                  "sample": f"one sentence pair, {real_models.SEQ_LEN} source and {real_models.SEQ_LEN} target "
                            f"tokens (vocabularies {real_models.SOURCE_VOCAB} and {real_models.TARGET_VOCAB}); "
                            "throughput is counted in target tokens",
                  "sockeye_args": real_models.SOCKEYE_MODEL_ARGS}
        input_shape = dict(zip(("source", "source_length", "target", "target_length"),
                               (list(a.shape) for a in inputs)))
    else:
        versions = {"gluoncv": importlib.metadata.version("gluoncv"), **versions}
        sample = {"sample_unit": "images", "sample": f"one {inputs[0].shape[2]}x{inputs[0].shape[3]} image"}
        input_shape = list(inputs[0].shape)
    if ignored:
        LOG.warning("%s: no FLOP rule for %s (counted as 0)", model, ", ".join(ignored))
    description = {
        "model": model,
        "input_shape": input_shape,
        "order": order,
        "num_arrays": len(entries),
        "total_params": int(sum(sizes)),
        "largest_array": int(max(sizes)),
        "generated_with": versions,
        "fwd_flops_total": int(sum(layer["fwd_flops"] for layer in layers)),
        **sample,
        "flops": "forward FLOPs per sample, multiply-add = 2; see benchmarks/workloads/make_shapes.py",
        "flops_ignored": ignored,
        "num_layers": len(layers),
        "params": entries,
        "layers": layers,
    }
    check_layers(description)
    return description


def dump(description: dict) -> str:
    """JSON with one parameter and one layer per line, so diffs of regenerated files stay readable."""
    lists = ("params", "layers")
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in description.items() if k not in lists]
    body = [f' {json.dumps(k)}: [\n' + ",\n".join("  " + json.dumps(item) for item in description[k]) + "\n ]"
            for k in lists]
    return "{\n" + "\n".join(head) + "\n" + ",\n".join(body) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(real_models.MODELS), choices=real_models.MODELS)
    parser.add_argument("--out-dir", type=pathlib.Path, default=SHAPES_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        description = describe(model)
        path = args.out_dir / f"{model}.json"
        if path.exists():  # the hand-written calibration (published throughput, its source) survives
            calibration = json.loads(path.read_text()).get("calibration")
            if calibration:
                description = {**description, "calibration": calibration}
        path.write_text(dump(description))
        LOG.info("%s: %d arrays, %d parameters (largest %d), %d layers, %.3g forward FLOPs per sample -> %s",
                 model, description["num_arrays"], description["total_params"], description["largest_array"],
                 description["num_layers"], description["fwd_flops_total"], path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

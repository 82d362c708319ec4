"""Write the trainable parameter shapes of gluoncv models, in forward order, to benchmarks/shapes/<model>.json.

The transport benchmark only needs each array's name, shape and dtype, so the JSON files are committed and the
benchmark runs without gluoncv. Regenerate with::

    pip install --no-deps gluoncv==0.10.5.post0 && pip install tqdm Pillow pyyaml yacs portalocker 'scipy<1.12'
    python benchmarks/make_shapes.py --models resnet50_v1 vgg19 inceptionv3

Forward order matters: P3 gives every array the priority of its layer in forward order (first layer most
urgent). It is taken from the symbolic graph (``list_arguments()`` of the network applied to a symbol, a
topological order of the ops consuming each parameter) and cross-checked against the order in which leaf blocks
run in one imperative forward pass; the two must agree or the script fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import pathlib
import sys

import mxnet as mx
import numpy as np

LOG = logging.getLogger("make_shapes")
SHAPES_DIR = pathlib.Path(__file__).resolve().parent / "shapes"
INPUT_SIZE = {"inceptionv3": 299}  # every other model takes 224 x 224 images


def build(model: str):
    """The gluoncv network with random init and every deferred shape resolved by one forward pass."""
    from gluoncv.model_zoo import get_model

    LOG.info("building %s with gluoncv %s", model, importlib.metadata.version("gluoncv"))
    net = get_model(model, pretrained=False)
    net.initialize(mx.init.Xavier())
    return net


def imperative_order(net, size: int) -> list[str]:
    """Trainable parameter names in the order their blocks run in one imperative forward pass."""
    order: list[str] = []
    seen: set[str] = set()
    handles = []

    def record(block, _inputs):
        for param in block._reg_params.values():
            if param.grad_req != "null" and param.name not in seen:
                seen.add(param.name)
                order.append(param.name)

    def visit(block):
        if block._reg_params:
            handles.append(block.register_forward_pre_hook(record))
        for child in block._children.values():
            visit(child)

    visit(net)
    net(mx.nd.zeros((1, 3, size, size)))
    for handle in handles:
        handle.detach()
    return order


def symbolic_order(net) -> list[str]:
    """Argument names of the symbolic graph (topological order), input excluded."""
    data = mx.sym.var("data")
    return [name for name in net(data).list_arguments() if name != "data"]


def describe(model: str) -> dict:
    net = build(model)
    size = INPUT_SIZE.get(model, 224)
    forward = imperative_order(net, size)
    symbolic = symbolic_order(net)
    params = net.collect_params()
    trainable = [name for name, p in params.items() if p.grad_req != "null"]
    if symbolic != forward:
        raise SystemExit(f"{model}: symbolic argument order and imperative forward order disagree")
    if set(symbolic) != set(trainable):
        raise SystemExit(f"{model}: graph arguments are not the trainable parameters")
    if trainable != symbolic:
        LOG.warning("%s: collect_params() order differs from forward order; using forward order", model)
    entries = [{"name": n, "shape": list(params[n].shape), "dtype": np.dtype(params[n].dtype).name}
               for n in symbolic]
    sizes = [params[n].data().size for n in symbolic]
    return {
        "model": model,
        "input_shape": [1, 3, size, size],
        "order": "forward (symbol list_arguments, checked against imperative forward hooks)",
        "num_arrays": len(entries),
        "total_params": int(sum(sizes)),
        "largest_array": int(max(sizes)),
        "generated_with": {"gluoncv": importlib.metadata.version("gluoncv"), "mxnet": mx.__version__},
        "params": entries,
    }


def dump(description: dict) -> str:
    """JSON with one parameter per line, so diffs of regenerated files stay readable."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in description.items() if k != "params"]
    params = ",\n".join("  " + json.dumps(p) for p in description["params"])
    return "{\n" + "\n".join(head) + '\n "params": [\n' + params + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50_v1", "vgg19", "inceptionv3"])
    parser.add_argument("--out-dir", type=pathlib.Path, default=SHAPES_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        description = describe(model)
        path = args.out_dir / f"{model}.json"
        path.write_text(dump(description))
        LOG.info("%s: %d arrays, %d parameters (largest %d) -> %s", model, description["num_arrays"],
                 description["total_params"], description["largest_array"], path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The models the replay benchmark replays: each layer's parameters and forward FLOPs.

    python benchmarks/replay_models.py            # writes benchmarks/data/replay_models.json

``resnet50_v1`` and ``vgg16`` are gluon's model-zoo networks (no weights are downloaded): one
forward pass of a 224x224 image with a hook on every block that owns parameters gives each
layer's input and output shapes, from which its FLOPs follow (a convolution: 2 x output
elements x input channels per group x kernel area; a dense layer: 2 x inputs x outputs;
batch norm: 4 per element; multiply-adds count as 2). ``bert_base`` is BERT-base's published
configuration (12 layers, hidden 768, 12 heads, feed-forward 3072, vocabulary 30522, 512
positions) at a sequence of 128 tokens: its parameter shapes and FLOPs follow from it
(2 x parameters per token for the dense layers, plus attention's 2 x 2 x seq^2 x hidden).

Layers are listed in forward order, each with its parameters in the order gluon's Trainer
numbers them (a layer's first parameter has the lowest index; priority = -index).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "replay_models.json")
IMAGE = (1, 3, 224, 224)


def _block_flops(block, inputs, output) -> float:
    """Forward FLOPs of one parameter-owning gluon block for one sample."""
    from mxnet.gluon import nn
    out_elems = float(output.size) / output.shape[0]
    if isinstance(block, nn.Conv2D):
        weight = block.weight.shape          # (out, in/groups, kh, kw)
        return 2.0 * out_elems * weight[1] * weight[2] * weight[3]
    if isinstance(block, nn.Dense):
        weight = block.weight.shape          # (out, in)
        return 2.0 * weight[0] * weight[1]
    return 4.0 * out_elems                   # batch norm and other elementwise layers


def zoo_model(name: str) -> list:
    """[{"name", "flops", "params": [shape, ...]}, ...] of a model-zoo network, forward order."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision
    net = vision.get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier())
    layers, seen = [], set()

    def hook(block, inputs, output):
        if id(block) in seen:
            return
        seen.add(id(block))
        layers.append((block, _block_flops(block, inputs, output)))
    for block in _leaves(net):
        block.register_forward_hook(hook)
    net(mx.nd.zeros(IMAGE))
    order = {p.name: i for i, p in enumerate(net.collect_params().values())}
    result = []
    for block, flops in layers:
        params = sorted(block._reg_params.values(), key=lambda p: order[p.name])
        params = [p for p in params if p.grad_req != "null"]
        result.append({"name": block.name, "flops": flops,
                       "params": [list(p.shape) for p in params],
                       "index": [order[p.name] for p in params]})
    return result


def _leaves(block):
    """Blocks that own parameters themselves (a Dense with an activation has a child too)."""
    if block._reg_params:
        yield block
    for child in block._children.values():
        yield from _leaves(child)


def bert_base(seq: int = 128, hidden: int = 768, layers: int = 12, ffn: int = 3072,
              vocab: int = 30522, positions: int = 512) -> list:
    """BERT-base's layers from its configuration, at ``seq`` tokens per sample."""
    def dense(name, n_in, n_out):
        return {"name": name, "flops": 2.0 * n_in * n_out * seq,
                "params": [[n_out, n_in], [n_out]]}

    def norm(name):
        return {"name": name, "flops": 8.0 * hidden * seq, "params": [[hidden], [hidden]]}
    result = [{"name": "embeddings", "flops": 2.0 * hidden * seq,
               "params": [[vocab, hidden], [positions, hidden], [2, hidden]]},
              norm("embeddings_norm")]
    for i in range(layers):
        prefix = "layer%d_" % i
        attention = dense(prefix + "qkv", hidden, 3 * hidden)
        attention["flops"] += 4.0 * seq * seq * hidden          # scores and weighted values
        result += [attention, dense(prefix + "attention_out", hidden, hidden),
                   norm(prefix + "attention_norm"), dense(prefix + "ffn_in", hidden, ffn),
                   dense(prefix + "ffn_out", ffn, hidden), norm(prefix + "ffn_norm")]
    result.append(dense("pooler", hidden, hidden))
    index = 0
    for layer in result:
        layer["index"] = list(range(index, index + len(layer["params"])))
        index += len(layer["params"])
    return result


def main() -> int:
    models = {"resnet50_v1": zoo_model("resnet50_v1"), "vgg16": zoo_model("vgg16"),
              "bert_base": bert_base()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(models, f, indent=None, separators=(",", ":"))
    for name, layers in models.items():
        count = sum(len(layer["params"]) for layer in layers)
        size = sum(numel(shape) for layer in layers for shape in layer["params"]) * 4
        print("%-12s %3d layers, %3d tensors, %6.1f MB fp32, %.2f GFLOPs forward per sample"
              % (name, len(layers), count, size / 1e6,
                 sum(layer["flops"] for layer in layers) / 1e9))
    print("wrote", OUT)
    return 0


def numel(shape) -> int:
    """Elements of a tensor of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


def model_bytes(model: str, dtype: str = "float32") -> int:
    """Bytes of ``model``'s trainable parameters (from the JSON this script writes)."""
    with open(OUT) as f:
        layers = json.load(f)[model]
    count = sum(numel(shape) for layer in layers for shape in layer["params"])
    return count * (2 if dtype == "float16" else 4)


if __name__ == "__main__":
    sys.exit(main())

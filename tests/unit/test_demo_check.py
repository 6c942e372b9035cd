"""The demo's closing check names the parameters a worker disagrees on (examples/train_digits.py)."""
import importlib.util
import os
import re

import pytest

from tests.support.paths import REPO

mx = pytest.importorskip("mxnet")


def load_demo():
    spec = importlib.util.spec_from_file_location(
        "train_digits", os.path.join(REPO, "examples", "train_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Rank0Differs:
    """A store whose broadcast hands back rank 0's parameters: ours with the last ``skew``
    values of the output layer's weight changed; ``pushpull`` sums over one worker (this one)."""

    def __init__(self, skew: int):
        self.skew = skew

    def broadcast(self, key, value, out):
        values = value.asnumpy()
        if self.skew:
            values[-10 - self.skew:-10] += 1.0     # the output layer's weight, before its bias
        out[:] = values

    def pushpull(self, key, value, out=None):
        pass


def test_the_check_names_the_parameters_that_differ_from_rank_0s():
    demo = load_demo()
    net = demo.build_net([mx.cpu()], seed=1)
    net(mx.nd.zeros((1, 64)))                     # the deferred shapes
    assert demo.check_identical(Rank0Differs(0), net, 1, None) > 0
    with pytest.raises(RuntimeError) as failed:
        demo.check_identical(Rank0Differs(3), net, 1, None)
    message = str(failed.value)
    assert "workers disagree on 3 parameter values" in message
    assert re.search(r"against rank 0's: dense\d+_weight \(3 of 640\)$", message), message

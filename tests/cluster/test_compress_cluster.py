"""Compressed dist_byteps rounds in real clusters give the simulated sums and shrink the pushes."""
import pytest

from tests.support.vans import van_env


CASES = {
    "onebit-ef-scaling": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
    "topk-momentum": {"compressor": "topk", "k": 0.01, "momentum": "nesterov"},
    "randomk": {"compressor": "randomk", "k": 0.05, "seed": 11},
    "dithering": {"compressor": "dithering", "k": 8, "partition": "natural", "normalize": "l2"},
    "mxnet-2bit": {"type": "2bit", "threshold": 0.5},
}


RATIO = {"onebit-ef-scaling": 1 / 32, "topk-momentum": 0.02, "randomk": 0.05,
         "dithering": 0.25, "mxnet-2bit": 1 / 16}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,van,contexts", [(c, "zmq", 1) for c in CASES]
                         + [("onebit-ef-scaling", "byteps_tcp", 2),
                            ("onebit-ef-scaling", "byteps_rdma", 2)])
def test_compressed_rounds_give_the_simulated_sums_and_the_pushes_shrink(case, van, contexts):
    import json
    from tests.cluster.test_worker_behaviour import run_checks
    results = run_checks("compress", json.dumps(CASES[case]), contexts,
                         env=van_env(van))
    for name in ("worker0", "worker1"):
        out = results[name][1]
        assert "COMPRESS OK" in out, out
        ratio = float(out.split("COMPRESS OK")[1].split("(")[1].split(")")[0])
        assert ratio <= RATIO[case] * 1.01 + 1e-4, (case, ratio)

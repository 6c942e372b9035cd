"""bench_pushpull's command line: where its results go (no jobs are run here)."""
import os

import pytest
from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_pushpull")


@pytest.mark.parametrize("out, plot, results", [
    ("bench_out/pushpull.png", "bench_out/pushpull.png", "bench_out/pushpull.json"),
    ("r.svg", "r.svg", "r.json"),
    ("a/b.PDF", "a/b.PDF", "a/b.json"),
    ("bench_out/run1.json", "bench_out/run1.png", "bench_out/run1.json"),
])
def test_out_names_the_plot_or_the_results(bench, out, plot, results):
    assert bench.output_paths(out) == (plot, results)


def test_an_out_that_is_neither_is_refused_before_anything_runs(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--out", "results.txt"])
    assert exc.value.code == 2
    assert "--out results.txt: name the plot (.png, .svg, .pdf) or the results (.json)" \
        in capsys.readouterr().err


def test_the_default_out_is_a_png_with_its_json(bench):
    args = bench.parse_args([])
    assert (args.plot_path, args.json_path) == (os.path.join("bench_out", "pushpull.png"),
                                                 os.path.join("bench_out", "pushpull.json"))


@pytest.fixture
def without_bench_extra(monkeypatch):
    for module in ("tqdm", "matplotlib"):
        monkeypatch.setitem(__import__("sys").modules, module, None)   # import fails


def test_help_needs_no_bench_extra(bench, without_bench_extra, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0 and "--cases" in capsys.readouterr().out


def test_a_run_without_the_bench_extra_says_what_to_install(bench, without_bench_extra):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick"])
    assert "needs tqdm and matplotlib: pip install -e '.[bench]'" in str(exc.value.code)


def test_the_printed_table_gives_each_sides_worker_cpu_per_iteration(bench):
    case = next(iter(bench.CASES.values()))
    up = bench.Run("dist_sync", "mxnet", median_s=0.2, worker_cpu_s=0.1071)
    ours = bench.Run("dist_byteps", "byteps", median_s=0.1, worker_cpu_s=0.0884)
    unmeasured = bench.Run("dist_byteps", "byteps", median_s=0.1)
    lines = bench.table([(case, 2, 2, 10 ** 8, up, ours), (case, 2, 2, 10 ** 8, up, unmeasured)])
    head, _, first, second = lines.splitlines()
    assert head.split(" | ")[-1] == "worker CPU ms/iter: upstream; byteps |"
    assert first.endswith("| 107.1; 88.4 |") and "| 2.00x |" in first
    assert second.endswith("| 107.1; - |")

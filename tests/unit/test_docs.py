"""The README and docs/ say what the code does: every variable, the test command, the current
benchmark results, and links that lead somewhere (mkdocs --strict checks docs/ itself)."""
import os
import re

from kvstore_byteps.config import Env
from kvstore_byteps.serving.backup_rounds import MAX_LATE_ROUNDS
from kvstore_byteps.words import count
from tests.support.paths import REPO

DOCS = os.path.join(REPO, "docs")


def read(*path):
    with open(os.path.join(REPO, *path)) as source:
        return source.read()


def anchors(markdown):
    """The heading ids mkdocs makes: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))
            for heading in re.findall(r"^#+ (.*)$", markdown, re.M)}


def test_every_variable_is_in_the_configuration_page():
    text = read("docs", "configuration.md")
    names = [v for k, v in vars(Env).items() if k.isupper()]
    assert [n for n in names if "| `%s` |" % n not in text] == []


def test_both_pages_give_the_servers_window_for_a_late_push_with_backup_workers():
    for page in ("configuration.md", "usage.md"):
        assert "at most %s ago" % count(MAX_LATE_ROUNDS, "round") in read("docs", page), page


def test_the_readme_is_a_front_door_with_the_two_commands():
    text = read("README.md")
    assert text.count("\n") <= 300
    command = "python -m pytest -q -n 2 --dist loadfile tests"
    assert "**Run the tests**: `bash .ci/run`" in text and "`%s`" % command in text
    # what the README says it runs (two processes by default)
    ci = read(".ci", "run")
    assert 'python -m pytest -q "${parallel[@]}" tests' in ci
    assert 'parallel=(-n "${PYTEST_WORKERS:-2}" --dist loadfile)' in ci
    assert "**Run the demo job**: `bash examples/run_demo.sh`" in text


def test_the_readmes_links_into_docs_lead_to_pages_and_headings():
    for page, anchor in re.findall(r"\]\(docs/([\w-]+\.md)(?:#([\w-]+))?\)", read("README.md")):
        target = read("docs", page)
        assert not anchor or anchor in anchors(target), (page, anchor)


def shown_between(page, begin, end):
    """The text of ``page`` between the marker lines ``begin`` and ``end``."""
    return page.split(begin + "\n")[1].split(end)[0]


def test_the_performance_page_shows_the_results_files_tables():
    from tests.support.benchmarks import load_benchmark
    tables = load_benchmark("results_table")
    page = read("docs", "performance.md")
    assert shown_between(page, "<!-- results table: made by benchmarks/results_table.py -->",
                         "<!-- end of results table -->") == tables.table()
    assert shown_between(page, "<!-- replay table: made by benchmarks/results_table.py replay -->",
                         "<!-- end of replay table -->") == tables.replay_table()


def test_the_performance_page_shows_each_straggler_results_table():
    """One current table per setting (loopback, emulated network): one results file each."""
    import glob
    import json
    paths = sorted(glob.glob(os.path.join(REPO, "benchmarks", "results", "straggler", "*.json")))
    assert paths
    page = read("docs", "performance.md")
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["table"][1:]      # the first line is the setting, in prose
        begin = "<!-- straggler table: made by benchmarks/bench_straggler.py, %s -->" \
            % os.path.basename(path)
        assert shown_between(page, begin, "\n<!-- end of straggler table -->") == "\n".join(rows)


def test_the_performance_page_shows_the_cost_model_table():
    """The fitted cost model's table (benchmarks/bench_cost.py), as its results file holds it."""
    import json
    with open(os.path.join(REPO, "benchmarks", "results", "cost", "loopback_2x2.json")) as f:
        rows = json.load(f)["table"]
    fitted = rows[:rows.index("")]             # the per-cell table follows a blank line
    page = read("docs", "performance.md")
    begin = "<!-- cost table: made by benchmarks/bench_cost.py, loopback_2x2.json -->"
    assert shown_between(page, begin, "\n<!-- end of cost table -->") == "\n".join(fitted)

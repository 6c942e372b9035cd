"""docs/design.md's Layout table (issue 63): one row per file of the package, each naming a file
that exists, in one line; so the table cannot drift from the tree as files split and move."""
import os
import re

from tests.support.paths import REPO

ROW = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def layout_rows():
    """``{path: what}`` of the first table under ``## Layout`` in docs/design.md."""
    text = open(os.path.join(REPO, "docs", "design.md")).read()
    section = text.split("\n## Layout\n", 1)[1]
    table = section.split("\n| path | what |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines():
        match = ROW.match(line)
        assert match, "not a one-line row of the Layout table: %r" % line
        assert match.group(1) not in rows, "two rows for %s" % match.group(1)
        rows[match.group(1)] = match.group(2)
    return rows


def package_files():
    found = set()
    for top in ("kvstore_byteps", "mxnet_patch"):
        for dirpath, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found.update(os.path.relpath(os.path.join(dirpath, f), REPO).replace(os.sep, "/")
                         for f in files if f.endswith(".py"))
    return found


def test_every_file_of_the_package_has_its_row_and_every_row_its_file():
    rows, files = set(layout_rows()), package_files()
    assert not files - rows, "files without a row in docs/design.md's Layout: %s" % sorted(
        files - rows)
    assert not rows - files, "rows naming no file: %s" % sorted(rows - files)


def test_a_row_says_its_files_job_in_a_line():
    long = {path: len(what) for path, what in layout_rows().items() if len(what) > 160}
    assert not long, long

"""The server's data paths (issue 47): one module per training mode behind serving/datapath.py,
each answering through the narrow ``Answers`` object, never through the server itself; and the
server delegating to its path without asking which one it has. Checked on the source."""
import ast
import os

import pytest
from tests.support.paths import REPO

SERVING = os.path.join(REPO, "kvstore_byteps", "serving")
#: the data-path modules: the seam, the shared base of the kept weights, one per mode
DATA_PATHS = ["datapath", "kept", "summed", "asynchronous", "backup"]
#: the server's own modules, which a data path may not import
SERVER = {"kvstore_byteps.serving.byteps", "kvstore_byteps.serving.dist", "kvstore_byteps.server"}


def tree(name):
    with open(os.path.join(SERVING, name + ".py")) as source:
        return ast.parse(source.read())


def imported(name):
    """Absolute names of the modules (and names from them) ``serving/<name>.py`` imports."""
    names = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = ["kvstore_byteps", "serving"][:3 - node.level] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update("%s.%s" % (base, alias.name) for alias in node.names)
    return names


def test_the_import_reader_resolves_relative_imports():
    assert "kvstore_byteps.serving.datapath.DataPath" in imported("summed")
    assert "kvstore_byteps.errors" in imported("kept")


@pytest.mark.parametrize("name", DATA_PATHS)
def test_a_data_path_neither_imports_nor_names_the_server(name):
    bad = sorted(n for n in imported(name) if any(n == s or n.startswith(s + ".") for s in SERVER))
    assert not bad, "serving/%s.py imports %s" % (name, bad)
    with open(os.path.join(SERVING, name + ".py")) as source:
        assert "BytePSServer" not in source.read(), "serving/%s.py names BytePSServer" % name


def test_the_server_asks_its_path_nothing_about_its_kind():
    """No ``weights is not None`` left, nor a successor: the server compares nothing of its
    path's (``self.path`` / ``self.weights`` in a test or a comparison)."""
    found = []
    for node in ast.walk(tree("byteps")):
        operands = ([node.left] + node.comparators if isinstance(node, ast.Compare) else
                    [node.operand] if isinstance(node, ast.UnaryOp) else [])
        for operand in operands:
            for inner in ast.walk(operand):
                if isinstance(inner, ast.Attribute) and inner.attr in ("path", "weights"):
                    found.append(node.lineno)
    assert not found, "serving/byteps.py tests its data path at lines %s" % found


def test_the_server_class_stays_small():
    server = next(node for node in tree("byteps").body
                  if isinstance(node, ast.ClassDef) and node.name == "BytePSServer")
    assert server.end_lineno - server.lineno + 1 <= 260

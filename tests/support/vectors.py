"""Access to the golden wire vectors captured from MXNet 1.9.1 (tests/data/vectors, whose
README.md says how they were captured; ``KVSTORE_BYTEPS_VECTORS`` points elsewhere)."""
import json
import os
from tests.support.paths import DATA

VECTOR_DIR = os.environ.get(
    "KVSTORE_BYTEPS_VECTORS",
    os.path.join(DATA, "vectors"))


def load_index():
    with open(os.path.join(VECTOR_DIR, "index.json")) as f:
        return json.load(f)


def read(name):
    with open(os.path.join(VECTOR_DIR, name), "rb") as f:
        return f.read()


def message_vectors():
    """Names of the vectors that hold a full message (a .meta.bin file)."""
    return [v["name"] for v in load_index() if os.path.exists(
        os.path.join(VECTOR_DIR, v["name"] + ".meta.bin"))]

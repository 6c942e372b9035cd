#!/usr/bin/env bash
# The main job in one command on a fresh machine: make .venv (once), install kvstore-byteps into
# it, then run the demo on a local cluster through launch.py. Extra arguments go to launch.py
# before the worker command (e.g. `bash examples/run_demo.sh --server mxnet`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet .
export PATH="$PWD/.venv/bin:$PATH"
exec python launch.py -n 2 -s 2 --timeout 600 "$@" python examples/pushpull_demo.py

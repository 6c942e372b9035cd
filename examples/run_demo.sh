#!/usr/bin/env bash
# The main job in one command on a fresh machine: make .venv (once), install kvstore-byteps with
# the examples extra into it (non-editable, so the start-up .pth is installed too), then train a
# small MLP on scikit-learn's digits with gluon and kvstore='dist_byteps' on a local cluster of
# 2 workers and 2 servers through launch.py. Extra arguments go to launch.py before the worker
# command (e.g. `bash examples/run_demo.sh --server mxnet`); the script's own options go in
# DEMO_ARGS (e.g. `DEMO_ARGS="--epochs 3 --contexts 2" bash examples/run_demo.sh`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# numpy<1.24 in the same command: MXNet 1.9.1 breaks on newer numpy, so pip must never upgrade it.
.venv/bin/python -m pip install --quiet ".[examples]" "numpy<1.24"
export PATH="$PWD/.venv/bin:$PATH"
# Our scheduler and our BytePS servers (the launcher's defaults); "$@" may change that, e.g.
# `--server mxnet` (upstream MXNet's C++ servers) or `--launcher netns` (an emulated network).
# shellcheck disable=SC2086  # DEMO_ARGS is a list of options
exec python launch.py -n 2 -s 2 --timeout 600 "$@" \
    python examples/train_digits.py ${DEMO_ARGS:-}

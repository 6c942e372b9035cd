#!/usr/bin/env python3
"""Start a parameter-server job from a checkout: the same program as ``kvstore-byteps-launch``.

    python launch.py -n 2 -s 2 python train.py --kvstore dist_byteps

See ``python launch.py --help`` and docs/launching.md.
"""
import sys

from kvstore_byteps.launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())

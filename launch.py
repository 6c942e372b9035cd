#!/usr/bin/env python3
"""Start a parameter-server job from a checkout: the same program as ``kvstore-byteps-launch``.

    python launch.py -n 2 -s 2 python train.py --kv-store dist_byteps

See ``python launch.py --help`` and the README's "Launching" sections.
"""
import sys

from kvstore_byteps.launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())

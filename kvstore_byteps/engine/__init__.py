"""The worker engine (BytePS design), framework-free: it never imports MXNet.

* :mod:`.partition` - partitions of a tensor, their ps keys and servers (pure)
* :mod:`.keyhash`   - ``BYTEPS_KEY_HASH_FN`` placement hashes (pure)
* :mod:`.upstream`  - upstream MXNet's key layout, for its C++ server (pure)
* :mod:`.credit`    - credit-based priority queue (pure)
* :mod:`.stages`    - the PUSH/PULL Pipeline: Stage, Task, one thread per stage
* :mod:`.trace`     - per-partition phase events, Chrome trace JSON
* :mod:`.reduce`    - local reduce/broadcast: numpy on CPU, NCCL through cupy on GPUs (lazy)

Submodules are imported on demand (nothing here), so the pure parts stay cheap to import.
"""

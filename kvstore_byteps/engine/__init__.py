"""The worker engine (BytePS design), framework-free: it never imports MXNet.

* :mod:`.partition` - partitions of a tensor, their ps keys and servers (pure)
* :mod:`.keyhash`   - ``BYTEPS_KEY_HASH_FN`` placement hashes (pure)
* :mod:`.upstream`  - upstream MXNet's key layout and cmd encoding, for its C++ server (pure)
* :mod:`.scheduler` - credit-based priority queue (pure)
* :mod:`.stages`    - Stage enum, Task, and the one-thread-per-stage Pipeline
* :mod:`.trace`     - per-partition stage events, Chrome trace JSON
* :mod:`.reduce`    - local reduce/broadcast: numpy on CPU, NCCL through cupy on GPUs (lazy)

Submodules are imported on demand (nothing here), so the pure parts stay cheap to import.
"""

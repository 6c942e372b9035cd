"""The worker engine (BytePS design), framework-free: it never imports MXNet.

* :mod:`.partition` - partitions of a tensor, their ps keys and servers (pure)
* :mod:`.keyhash`   - ``BYTEPS_KEY_HASH_FN`` placement hashes (pure)
* :mod:`.upstream`  - upstream MXNet's key layout, for its C++ server (pure)
* :mod:`.credit`    - credit-based priority queue (pure)
* :mod:`.stage_specs` - the stages as data: Stage, StageSpec (how a stage function is called)
* :mod:`.stages`    - the PUSH/PULL Pipeline: Task, one queue and one thread per stage
* :mod:`.trace`     - per-partition phase events, Chrome trace JSON
* :mod:`.reduce`    - local reduce/broadcast: numpy on CPU, NCCL through cupy on GPUs (lazy)
* :mod:`.worker`    - the WorkerEngine, composed of :mod:`.cluster` (cluster life),
  :mod:`.values` (keys' set-up and reads), :mod:`.rounds` (the pipeline's rounds) and
  :mod:`.fusion` (gradient buckets), each behind a port

Submodules are imported on demand (nothing here), so the pure parts stay cheap to import.
"""

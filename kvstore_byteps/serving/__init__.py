"""The parts of the server; ``kvstore_byteps.server`` assembles and runs them.

``protocol`` (the frame layouts of MXNet's requests), ``store`` (the key-value store of MXNet's
semantics), ``dist`` (KVStoreDistServer: MXNet's server behaviour), ``byteps`` (BytePSServer:
the BytePS requests on top), ``keys`` (its keys), ``datapath`` (the seam to the training mode's
data path, one per mode: ``summed``, ``asynchronous``, ``backup``; ``kept`` what the last two
share), ``rounds`` (per-key sync rounds, double-buffered), ``summing``
(the summing threads), ``batch`` (batched small keys), ``compressed`` (the compressed BytePS
path), ``restart`` and ``recovery`` (a restarted server's filter and its wait for the workers'
reports), ``pacing``, ``profiler``, ``updater`` (the optimizer on the server), ``unpickle``
(the restricted unpickler for optimizers), ``twobit`` (MXNet's 2-bit gradient compression).
"""

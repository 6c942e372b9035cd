"""Gradient compression for ``dist_byteps`` (BytePS 0.2.5's compressors, MXNet's 2-bit). Pure.

* :mod:`.codecs`  - the compressors: onebit (+scaling), topk, randomk, dithering, twobit
* :mod:`.params`  - ``set_gradient_compression``'s dict: parsed, checked, one clear error
* :mod:`.state`   - per-partition error feedback and Nesterov momentum around a codec

Status: the compressors, the parameters and the per-partition state are built and tested;
they are **not wired into the worker's or the server's data path yet**, and
``kv.set_gradient_compression`` still refuses (see the README).
"""

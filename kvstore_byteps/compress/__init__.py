"""Gradient compression for ``dist_byteps`` (BytePS 0.2.5's compressors, MXNet's 2-bit). Pure.

* :mod:`.codecs`  - the compressors: onebit (+scaling), topk, randomk, dithering, twobit
* :mod:`.params`  - ``set_gradient_compression``'s dict: parsed, checked, one clear error
* :mod:`.state`   - per-partition error feedback and Nesterov momentum around a codec
* :mod:`.twobit`  - MXNet's own 2-bit wire form (its workers' and servers'), for MXNet's
  servers and for MXNet's workers on ours

The worker engine compresses each large float32 partition's push and decodes its pull; the
BytePS server decodes pushes, sums, and compresses each round's sum once for the pulls.
"""

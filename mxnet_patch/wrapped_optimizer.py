"""An MXNet optimizer that reduces each gradient before the update of the optimizer it wraps:
the base of BytePS's and Horovod's ``DistributedOptimizer``."""
import mxnet as mx

__all__ = ["ReducingOptimizer"]


class ReducingOptimizer(mx.optimizer.Optimizer):
    """Wraps ``optimizer``; a subclass defines :meth:`_reduce`. Everything else (learning rate,
    multipliers, states) is the wrapped optimizer's."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def _reduce(self, index, grad) -> None:
        """Reduce ``grad`` (a list when ``index`` is one) over all processes, in place."""
        raise NotImplementedError

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def update(self, index, weight, grad, state):
        self._reduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._reduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)

"""kvstore_byteps.finish_training finds the store and the (key, arrays) pairs of a gluon Trainer,
a Module or a store with its params, and does nothing where there is nothing on the servers;
TrainingOver is an exit with status 0. With stand-ins: no MXNet, no sockets."""
from types import SimpleNamespace

import pytest

import kvstore_byteps
from kvstore_byteps.training import finish_training


class Store:
    type = "dist_sync_byteps"

    def __init__(self):
        self.finished = None

    def finish_training(self, pairs):
        self.finished = pairs


def trainer(store, initialised=True, on_store=True):
    params = [SimpleNamespace(list_data=lambda n=n: ["data%d" % n]) for n in range(2)]
    return SimpleNamespace(_params=params, _kv_initialized=initialised, _kvstore=store,
                           _update_on_kvstore=on_store)


def test_a_trainers_keys_are_the_indices_of_its_parameters():
    store = Store()
    finish_training(trainer(store))
    assert store.finished == [(0, ["data0"]), (1, ["data1"])]


@pytest.mark.parametrize("initialised,on_store", [(False, True), (True, False)])
def test_nothing_to_read_when_the_trainer_never_stepped_or_updates_itself(initialised,
                                                                          on_store):
    store = Store()
    finish_training(trainer(store, initialised, on_store))
    assert store.finished is None


def test_a_modules_keys_are_its_parameter_names_and_its_params_are_read_again():
    store = Store()
    group = SimpleNamespace(param_names=["fc_weight", "fc_bias"], param_arrays=[["w"], ["b"]])
    module = SimpleNamespace(_exec_group=group, _kvstore=store, _update_on_kvstore=True,
                             _params_dirty=False)
    finish_training(module)
    assert store.finished == [("fc_weight", ["w"]), ("fc_bias", ["b"])]
    assert module._params_dirty


def test_a_store_takes_its_params_as_a_mapping():
    store = Store()
    finish_training(store, {3: "weights"})
    assert store.finished == [(3, "weights")]


def test_mxnets_dist_async_reads_the_weights_after_a_barrier_and_dist_sync_needs_nothing():
    calls = []
    for kind in ("dist_async", "dist_sync"):
        store = SimpleNamespace(type=kind, _barrier=lambda k=kind: calls.append((k, "barrier")),
                                pull=lambda key, out, k=kind: calls.append((k, key, out)))
        finish_training(store, {0: "w"})
    assert calls == [("dist_async", "barrier"), ("dist_async", 0, "w")]


def test_anything_else_is_refused_naming_it():
    with pytest.raises(TypeError, match="got int"):
        finish_training(7)


def test_training_over_is_a_clean_exit_that_except_exception_does_not_swallow():
    over = kvstore_byteps.TrainingOver("the training is over")
    assert isinstance(over, SystemExit) and over.code == 0     # Python's exit status
    assert str(over) == "the training is over"
    assert not isinstance(over, Exception)

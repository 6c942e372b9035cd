"""The ``ps.PBMeta`` protobuf schema of MXNet 1.9.1's ps-lite, built at import time.

The schema is declared here as a ``FileDescriptorProto`` instead of generated code so the package
needs no ``protoc`` step and works with any protobuf runtime. Field numbers and types follow
docs/pslite-wire.md §2. Fields numbered 100 and up are BytePS extensions: optional, so upstream
peers skip them as unknown fields.
"""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto

# (name, number, type, label, extra options)
_NODE_FIELDS = [
    ("role", 1, _F.TYPE_INT32, _F.LABEL_REQUIRED, {}),
    ("id", 2, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("hostname", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, {}),
    ("port", 4, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("is_recovery", 5, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    ("customer_id", 10, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # BytePS extension: the rank a worker asks for (DMLC_WORKER_ID); upstream ignores it.
    ("rank_hint", 100, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # BytePS extension: this node heartbeats every so many ms, so the scheduler may declare it
    # dead when it falls silent (upstream nodes do not send it and are never declared dead
    # unless they heartbeat).
    ("heartbeat_ms", 101, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # BytePS extension: this node also accepts byteps_tcp connections at this port (our
    # nodes on the default van, van/auto/van.py); upstream nodes neither send nor relay it.
    ("tcp_port", 102, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
]
_CONTROL_FIELDS = [
    ("cmd", 1, _F.TYPE_INT32, _F.LABEL_REQUIRED, {}),
    ("node", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, {"type_name": ".ps.PBNode"}),
    ("barrier_group", 3, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("msg_sig", 4, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, {}),
]
_META_FIELDS = [
    ("head", 1, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("body", 2, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, {}),
    ("control", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, {"type_name": ".ps.PBControl"}),
    ("request", 4, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {"default_value": "false"}),
    ("push", 5, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    ("simple_app", 6, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {"default_value": "false"}),
    ("app_id", 7, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("timestamp", 8, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("data_type", 9, _F.TYPE_INT32, _F.LABEL_REPEATED, {"packed": True}),
    ("customer_id", 10, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("data_size", 11, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    ("pull", 12, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    ("priority", 13, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {"default_value": "0"}),
    # BytePS extensions (unknown to upstream ps-lite, which skips them).
    ("error", 100, _F.TYPE_STRING, _F.LABEL_OPTIONAL, {}),
    ("rdma_addr", 101, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, {}),
    ("rdma_rkey", 102, _F.TYPE_UINT32, _F.LABEL_OPTIONAL, {}),
    ("round", 103, _F.TYPE_INT64, _F.LABEL_OPTIONAL, {}),
    # the scheduler's notice that the node in control.node fell silent (on a HEARTBEAT)
    ("dead_node", 104, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    # how many times the server this request goes to (or the recovered node of an ADD_NODE)
    # was restarted: a restarted server drops requests meant for the process before it
    ("epoch", 105, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # on a BytePS push: the worker's timestamp of the pull that rides along with it, which
    # the server answers (as if it had been sent right after the push) once the round is summed
    ("pull_timestamp", 106, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # on a HEARTBEAT: why a node ends the job (to the scheduler), passed on to every node
    ("abort", 107, _F.TYPE_STRING, _F.LABEL_OPTIONAL, {}),
    # on a default pull: answer it once the key's initialising push arrived (a worker that
    # declares tensors in any order), instead of refusing a pull of an unknown key
    ("await_init", 108, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    # beside "abort": the exit status every node of the job ends with (a worker's sys.exit(N))
    ("abort_status", 109, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # on a BARRIER request: which of a worker's barriers it is (barriers.py's BARRIER_KINDS:
    # "finish", "shutdown"; none: the program's own); upstream schedulers ignore it
    ("barrier_kind", 110, _F.TYPE_STRING, _F.LABEL_OPTIONAL, {}),
    # on a row_sparse pull: the timestamp of this worker's push of the same rows' range that
    # it follows; the server answers it once that push's round is complete and updated
    ("after_push", 111, _F.TYPE_INT32, _F.LABEL_OPTIONAL, {}),
    # the scheduler's notice that the worker in control.node left an elastic job (on a
    # HEARTBEAT; BYTEPS_MIN_WORKERS): the job goes on without it
    ("worker_left", 112, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    # on an ADD_NODE after the cluster formed: the worker in control.node took a departed
    # worker's id in an elastic job (to it: the node list it joins with)
    ("worker_joined", 113, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
    # beside "abort", to a late worker that had not joined an elastic job: the others
    # finished it (the notice is no failure of the job)
    ("job_finished", 114, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, {}),
]


def _add_message(file_proto, name, fields):
    msg = file_proto.message_type.add()
    msg.name = name
    for field_name, number, ftype, label, extra in fields:
        field = msg.field.add()
        field.name, field.number, field.type, field.label = field_name, number, ftype, label
        if "type_name" in extra:
            field.type_name = extra["type_name"]
        if "default_value" in extra:
            field.default_value = extra["default_value"]
        if extra.get("packed"):
            field.options.packed = True


def _build_classes():
    file_proto = descriptor_pb2.FileDescriptorProto()
    file_proto.name = "kvstore_byteps/meta.proto"
    file_proto.package = "ps"
    file_proto.syntax = "proto2"
    _add_message(file_proto, "PBNode", _NODE_FIELDS)
    _add_message(file_proto, "PBControl", _CONTROL_FIELDS)
    _add_message(file_proto, "PBMeta", _META_FIELDS)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    classes = [message_factory.GetMessageClass(pool.FindMessageTypeByName("ps." + name))
               for name in ("PBNode", "PBControl", "PBMeta")]
    return classes


PBNode, PBControl, PBMeta = _build_classes()

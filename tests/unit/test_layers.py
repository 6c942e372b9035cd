"""The layers of docs/design.md (who may import whom) and its other structural rules, checked on the
source (module-level and lazy imports alike)."""
import ast
import os

import pytest
from tests.support.paths import REPO

PKG = os.path.join(REPO, "kvstore_byteps")


def modules(folder):
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, REPO)[:-3].replace(os.sep, "."), path


def import_base(package, node):
    """The absolute module an ``ast.ImportFrom`` in ``package`` imports from."""
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
    return base


def imported(module, path):
    """Absolute names of everything ``path`` imports."""
    package = module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = import_base(package, node)
            names.add(base)
            names.update("%s.%s" % (base, alias.name) for alias in node.names)
    return names


VAN = "kvstore_byteps.van"
#: one package per transport; only the registry names them (as strings, imported when chosen)
TRANSPORTS = ["%s.%s" % (VAN, name) for name in ("tcp", "rdma", "zmq", "p3", "auto", "loopback")]
#: the interface every van implements, the registry of transports, the transports' shared auth
SEAM = ["%s.%s" % (VAN, name) for name in ("base", "registry", "auth")]
#: ps-lite's layers inside van/, bottom up, and what each may not import (docs/design.md)
VAN_FORBIDDEN = {
    "wire": SEAM + [VAN + ".runtime", VAN + ".kv"] + TRANSPORTS,
    "seam": [VAN + ".runtime", VAN + ".kv"] + TRANSPORTS,
    "runtime": [VAN + ".kv"] + TRANSPORTS,
    "kv": TRANSPORTS,
    "transport": [VAN + ".runtime", VAN + ".kv"],
}


def van_layer(module):
    """The layer of a module under van/ (None: a module no layer holds)."""
    if module in (VAN, VAN + ".__init__") or any(matches(module, p) for p in SEAM):
        return "seam"
    if any(matches(module, prefix) for prefix in TRANSPORTS):
        return "transport"
    for layer in ("wire", "runtime", "kv"):
        if matches(module, "%s.%s" % (VAN, layer)):
            return layer
    return None


def forbidden(module):
    """Prefixes ``module`` must not import, per docs/design.md's layers."""
    server = ["kvstore_byteps.server", "kvstore_byteps.serving"]
    ours_below = ["kvstore_byteps.van", "kvstore_byteps.engine"] + server + [
        "kvstore_byteps.scheduler", "mxnet_patch"]
    if matches(module, "kvstore_byteps.config") or module in ("kvstore_byteps.errors",
                                                              "kvstore_byteps.ports"):
        return ours_below + ["kvstore_byteps.mxproto", "mxnet", "zmq"]
    if module == "kvstore_byteps.mxproto":     # MXNet's protocol: no transport, no MXNet
        return ours_below + ["mxnet", "zmq"]
    if module.startswith("kvstore_byteps.compress"):   # pure numpy codecs
        return ours_below + ["kvstore_byteps.mxproto", "mxnet", "zmq"]
    if module.startswith("kvstore_byteps.van"):    # the transport knows nothing of MXNet
        return ["kvstore_byteps.engine"] + server + ["kvstore_byteps.mxproto", "mxnet_patch",
                                                    "mxnet"] + VAN_FORBIDDEN[van_layer(module)]
    if module.startswith("kvstore_byteps.engine"):
        return server + ["mxnet_patch", "mxnet"]
    if module.startswith(tuple(server)):
        return ["kvstore_byteps.engine", "mxnet_patch"]
    if module.startswith("kvstore_byteps.launcher"):
        return ours_below + ["mxnet", "zmq"]
    return []


def matches(name, prefix):
    """``prefix`` itself and its submodules."""
    return name == prefix or name.startswith(prefix + ".")


def test_matcher_catches_submodules_only():
    assert matches("kvstore_byteps.serving.rounds.KeyRounds", "kvstore_byteps.serving")
    assert not matches("kvstore_byteps.serverless", "kvstore_byteps.server")


CASES = [(m, p) for m, p in modules(PKG)]


@pytest.mark.parametrize("module,path", CASES, ids=[m for m, _ in CASES])
def test_module_respects_layers(module, path):
    bad = sorted(name for name in imported(module, path) for prefix in forbidden(module)
                 if matches(name, prefix))
    assert not bad, "%s imports %s, which its layer may not" % (module, bad)


def test_launcher_uses_only_config():
    """launch.py is the installed launcher; the launcher knows config (and the free-port helper) and nothing else of ours."""
    script = {n for n in imported("launch", os.path.join(REPO, "launch.py"))
              if n.startswith(("kvstore_byteps", "mxnet_patch"))}
    assert script == {"kvstore_byteps.launcher.cli", "kvstore_byteps.launcher.cli.main"}, script
    # config's own pure helpers (its error class, counted nouns) come with it
    allowed = ("kvstore_byteps.config", "kvstore_byteps.errors", "kvstore_byteps.words",
               "kvstore_byteps.ports", "kvstore_byteps.launcher")
    for module, path in CASES:
        if module.startswith("kvstore_byteps.launcher"):
            ours = {n for n in imported(module, path) if n.startswith("kvstore_byteps.")}
            assert all(n.startswith(allowed) for n in ours), (module, ours)


def test_zmq_imported_by_the_zmq_van_only():
    users = {m for m, p in CASES if any(n == "zmq" or n.startswith("zmq.")
                                        for n in imported(m, p))}
    assert users == {"kvstore_byteps.van.zmq.van", "kvstore_byteps.van.zmq.auth"}, users


def test_every_module_of_the_van_is_in_one_layer():
    """van/ holds ps-lite's layers one package each (wire, node runtime, KV layer, one per
    transport) and the seam between runtime and transports; no module sits outside them."""
    assert not [m for m, _ in CASES if m.startswith(VAN + ".") and van_layer(m) is None]
    assert {van_layer(m) for m, _ in CASES if matches(m, VAN)} == set(VAN_FORBIDDEN)


def test_the_layers_above_the_van_never_import_a_transport():
    """The engine, the server, the scheduler and the MXNet store speak to the KV layer and the
    node runtime (with the wire's names: groups, node ids, key ranges); the runtime gets its van
    from the registry, so none of them imports a transport, the seam or the registry."""
    allowed = tuple(VAN + "." + layer for layer in ("kv", "runtime", "wire"))
    cases = CASES + list(modules(os.path.join(REPO, "mxnet_patch")))
    users = {}
    for module, path in cases:
        if not matches(module, VAN):
            bad = {n for n in imported(module, path)
                   if matches(n, VAN) and not any(matches(n, a) for a in allowed)}
            if bad:
                users[module] = sorted(bad)
    assert not users, users
    assert any(matches(n, VAN + ".kv") for n in imported(
        "kvstore_byteps.engine.cluster", os.path.join(PKG, "engine", "cluster.py")))


def uses_of(attribute, prefixes, cases):
    """``module:line`` of every ``x.<attribute>`` in the modules under ``prefixes``."""
    found = []
    for module, path in cases:
        if module.startswith(prefixes):
            found += ["%s:%d" % (module, node.lineno)
                      for node in ast.walk(ast.parse(open(path).read()))
                      if isinstance(node, ast.Attribute) and node.attr == attribute]
    return found


def test_the_engine_and_the_server_never_reach_into_the_van():
    """The KV layer owns where answers land and which buffers requests use; the worker engine,
    the server and the MXNet store speak to it, not to the van under it (``po.van``); the KV
    layer itself lands answers through the postoffice's ``landing`` calls, never the van."""
    assert not uses_of("van", ("kvstore_byteps.engine", "kvstore_byteps.serving",
                               "kvstore_byteps.server", "kvstore_byteps.van.kv", "mxnet_patch"),
                       CASES + list(modules(os.path.join(REPO, "mxnet_patch"))))


def test_the_engine_leaves_the_kv_layers_locks_to_it():
    """Recording a push atomically with its send is the KV layer's hook (``on_send``), not the
    engine holding ``send_lock``."""
    assert not uses_of("send_lock", ("kvstore_byteps.engine",), CASES)


def test_the_engines_parts_do_not_import_the_engine():
    """Layouts, routes and the recovery keeper are parts the worker engine is composed of:
    their arrows point down, never back to ``engine.worker``."""
    for module, path in CASES:
        if module.startswith("kvstore_byteps.engine.") and module != "kvstore_byteps.engine.worker":
            assert not any(matches(name, "kvstore_byteps.engine.worker")
                           for name in imported(module, path)), module


def test_node_id_arithmetic_lives_in_the_message_module():
    """ps-lite's node id rules (servers even from 8, workers odd from 9) are written once."""
    import re
    pattern = re.compile(r"(id|recver|sender)\w*\s*%\s*2|\b[89] \+ 2 \*")
    found = []
    for module, path in CASES:
        if module == "kvstore_byteps.van.wire.message":
            continue
        for number, line in enumerate(open(path), 1):
            if pattern.search(line):
                found.append("%s:%d" % (module, number))
    assert not found, found


def test_the_byteps_and_horovod_apis_build_on_the_collective_only():
    """kvstore_byteps.mxnet and kvstore_byteps.horovod are front ends: they reach the store
    through mxnet_patch.collective (and read variable names from config), never the engine,
    the server or the transport."""
    allowed = ("mxnet_patch.collective", "mxnet_patch.wrapped_optimizer", "kvstore_byteps.mxnet",
               "kvstore_byteps.config")
    for module, path in CASES:
        if module.startswith(("kvstore_byteps.mxnet", "kvstore_byteps.horovod")):
            ours = {n for n in imported(module, path)
                    if n.startswith(("kvstore_byteps.", "mxnet_patch"))}
            assert all(n.startswith(allowed) for n in ours), (module, ours)


#: The files that may touch the process environment besides config/environment.py, and why:
#: each builds the environment of the processes the launcher starts (a copy of its own, plus
#: what the plan adds), which is what a launcher is for; none reads a setting from it.
ENVIRONMENT_USERS = {
    "kvstore_byteps/config/environment.py": "the one reader: Config.from_env() reads through it",
    "kvstore_byteps/compiled.py": "KVSTORE_BYTEPS_PURE_PYTHON, read at import (before any "
                                  "Config): which files the modules of the hot path load from",
    "kvstore_byteps/launcher/job.py": "a Job's children start from this process's environment",
    "kvstore_byteps/launcher/bpslaunch.py": "main(): the environment bpslaunch plans from and "
                                            "hands to its children",
    "kvstore_byteps/launcher/cli.py": "--env NAME passes the launcher's value on to the nodes "
                                      "(and the key check sees what they will get)",
    "kvstore_byteps/launcher/guard.py": "the node's environment with PATH extended",
    "kvstore_byteps/launcher/slurm.py": "run(): the allocation Slurm describes in the "
                                        "launcher's environment (SLURM_*)",
    "kvstore_byteps/launcher/mpi.py": "run(): which of the launcher's variables mpirun "
                                      "exports to the ranks",
    "kvstore_byteps/launcher/node.py": "the rank srun or mpirun gave (their variables), and "
                                       "the environment its node starts from",
}
_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(path):
    """``line`` of every use of ``os.environ`` / ``os.getenv`` / ``os.putenv`` ... in ``path``
    (under whatever name ``os`` was imported as, or imported from it)."""
    tree = ast.parse(open(path).read())
    names_of_os = {alias.asname or alias.name for node in ast.walk(tree)
                   if isinstance(node, ast.Import) for alias in node.names if alias.name == "os"}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENT
                and isinstance(node.value, ast.Name) and node.value.id in names_of_os):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in _ENVIRONMENT for alias in node.names):
            found.append(node.lineno)
    return found


def test_environment_uses_are_found_however_os_is_spelled(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os as o\nfrom os import getenv\nx = o.environ.get('A')\n"
                      "y = dict(environ={})\n")
    assert sorted(environment_uses(str(source))) == [2, 3]


def test_only_config_reads_the_environment():
    """Issue 47, config read once: settings come from Config.from_env(); only the launcher's
    builders of its children's environments touch os.environ besides (ENVIRONMENT_USERS)."""
    paths = [p for _, p in CASES] + [p for _, p in modules(os.path.join(REPO, "mxnet_patch"))]
    paths.append(os.path.join(REPO, "launch.py"))
    users = {os.path.relpath(p, REPO).replace(os.sep, "/"): environment_uses(p) for p in paths}
    users = {path: lines for path, lines in users.items() if lines}
    assert set(users) <= set(ENVIRONMENT_USERS), {
        path: lines for path, lines in users.items() if path not in ENVIRONMENT_USERS}
    assert set(ENVIRONMENT_USERS) <= set(users), "allowed, but no longer needed: %s" % sorted(
        set(ENVIRONMENT_USERS) - set(users))


#: the owners whose parts get a port instead (issue 63): only the module defining each names it
OWNERS = ("WorkerEngine", "KVWorker", "KVStoreBytePS")
PRODUCT = CASES + list(modules(os.path.join(REPO, "mxnet_patch"))) + [
    ("launch", os.path.join(REPO, "launch.py"))]


def names_in(path, wanted):
    """``(name, line)`` of every code use of a name in ``wanted``: a name, an attribute, an
    import (comments and docstrings are prose, not uses)."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(a.name.rsplit(".", 1)[-1], node.lineno) for a in node.names
                      if a.name.rsplit(".", 1)[-1] in wanted]
        elif isinstance(node, ast.Name) and node.id in wanted:
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in wanted:
            found.append((node.attr, node.lineno))
        elif isinstance(node, ast.ClassDef) and node.name in wanted:
            found.append(("class " + node.name, node.lineno))
    return found


def test_only_its_own_module_names_an_owner():
    """The worker engine, the KV layer's worker and the MXNet store are reached through the
    objects their modules hand out (``start_engine``, ``open_worker``, ``register``); every
    other part gets a port with the few operations it needs (PyTorch's DDP comm hooks get a
    state and a bucket, never the DDP module)."""
    homes = {}
    for module, path in PRODUCT:
        for name, _ in names_in(path, {"class " + o for o in OWNERS} | set(OWNERS)):
            if name.startswith("class "):
                homes[name[6:]] = module
    assert set(homes) == set(OWNERS), homes
    users = {}
    for module, path in PRODUCT:
        for name, line in names_in(path, set(OWNERS)):
            if homes[name.replace("class ", "")] != module:
                users.setdefault(name, []).append("%s:%d" % (module, line))
    assert not users, users


#: the plug-ins that once held their owner and called its privates (issue 63)
PLUG_INS = ["kvstore_byteps.engine.fusion", "kvstore_byteps.engine.cluster",
            "kvstore_byteps.engine.values", "kvstore_byteps.engine.rounds",
            "kvstore_byteps.van.kv.recovery", "mxnet_patch.store_modes",
            "mxnet_patch.sync_training", "mxnet_patch.async_training",
            "mxnet_patch.backup_workers", "kvstore_byteps.engine.sparse",
            "mxnet_patch.sparse_keys"]


def private_reaches(path):
    """``name:line`` of every ``x._name`` where ``x`` is not ``self``/``cls`` (dunders aside):
    a member private to another object."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append("%s:%d" % (node.attr, node.lineno))
    return found


def test_private_reaches_are_found(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("a = store._engine\nb = self._own\nc = x.__class__\nd = f()._q\n")
    assert private_reaches(str(source)) == ["_engine:1", "_q:4"]


@pytest.mark.parametrize("module", PLUG_INS)
def test_a_plug_in_reaches_no_private_member(module):
    path = dict(PRODUCT)[module]
    assert not private_reaches(path), "%s reaches %s" % (module, private_reaches(path))


#: issue 63's sizes: a file grown past this holds more than one job; so does a longer function
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_ENGINE_LINES = 300


def test_no_product_file_holds_more_than_one_jobs_lines():
    long = {os.path.relpath(path, REPO): n for _, path in PRODUCT
            for n in [sum(1 for _ in open(path))] if n > MAX_FILE_LINES}
    assert not long, "split these where their concerns part: %s" % long


def test_no_function_is_longer_than_a_screen():
    long = []
    for module, path in PRODUCT:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append("%s.%s: %d lines" % (module, node.name, lines))
    assert not long, long


def test_the_worker_engine_is_composed_not_grown():
    """WorkerEngine hands its parts (cluster life, key values, rounds, buckets) their ports."""
    path = dict(PRODUCT)["kvstore_byteps.engine.worker"]
    [engine] = [node for node in ast.walk(ast.parse(open(path).read()))
                if isinstance(node, ast.ClassDef) and node.name == "WorkerEngine"]
    assert engine.end_lineno - engine.lineno + 1 <= MAX_ENGINE_LINES


def module_level_imports(module, path, known):
    """The modules of ``known`` that ``path`` imports when it is imported (not lazily inside a
    function): ``from . import x`` counts the submodule ``x``, not its package."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(open(path).read()).body:
        for inner in ([node] if not isinstance(node, (ast.If, ast.Try)) else ast.walk(node)):
            if isinstance(inner, ast.Import):
                found.update(alias.name for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                base = import_base(package, inner)
                subs = {"%s.%s" % (base, alias.name) for alias in inner.names} & known
                found.update(subs or {base})
    return (found & known) - {module}


def test_the_import_graph_has_no_cycle():
    """Module-level imports only point down (issue 63): a part never needs its owner loaded."""
    cases = {m[:-len(".__init__")] if m.endswith(".__init__") else m: p for m, p in PRODUCT}
    graph = {m: module_level_imports(m, p, set(cases)) for m, p in cases.items()}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for other in sorted(graph[node]):
            if state.get(other) == "open":
                cycles.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, [" -> ".join(cycle) for cycle in cycles]

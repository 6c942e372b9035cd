"""``--launcher local``: every node on this machine, on 127.0.0.1."""
from ..ports import free_port
from .job import NodeStarter
from .plan import local_hosts
from .runs import plan, print_dry_run, run_job


def run(args) -> int:
    """All nodes on this machine, on 127.0.0.1."""
    hosts = local_hosts()
    specs = plan(args, hosts, args.port or free_port())
    if args.dry_run:
        print_dry_run(specs, hosts)
        return 0
    return run_job(args, specs, NodeStarter(args.python))

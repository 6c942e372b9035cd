"""The job launcher: scheduler, servers and workers on this machine, on hosts over ssh, on an
emulated network of Linux network namespaces, or through the engines clusters run jobs with
(Slurm, MPI, Kubernetes).

Modules: ``plan`` (pure: options, hostfiles, placement, each node's environment), ``guard`` (runs
on the node: ties the node's process group to the launcher's lifetime), ``job`` (starts and
supervises the nodes, prefixes their output), ``procs`` (exit statuses, death signals,
liveness), ``netns`` (the emulated network), ``ssh`` (remote command lines and the preflight),
``slurm`` (the allocation, nodes as job steps), ``mpi`` (the mpirun command line),
``rankrole`` (pure: a rank from srun or mpirun to a node's role), ``node`` (``kvstore-byteps-node``:
one rank becomes its node), ``kubernetes`` (the job as Kubernetes objects, kubectl),
``local`` (every node on this machine), ``runs`` (what every engine's run shares: the nodes
planned from the command line, the dry run, the supervised job), ``cli`` (the command line:
``kvstore-byteps-launch`` and ``python launch.py``; parses and picks the engine, whose module's
``run(args)`` owns the run). Only ``kvstore_byteps.config`` (with its errors and nouns) and the
free-port helper are imported from the rest of the package.
"""

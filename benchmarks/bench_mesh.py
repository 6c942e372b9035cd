"""Ceiling of the emulated network: the traffic of one parameter-server step with plain sockets.

    sudo python benchmarks/bench_mesh.py --workers 4 --servers 4 --mbytes 100

Each of W worker hosts sends ``mbytes / S`` to each of S server hosts while every server sends
the same amount back to every worker, all at once: the bytes a parameter-server step moves, with
no summation, no protocol and no scheduling, through plain TCP sockets (one thread per
direction and connection, ``sendall`` / ``recv_into`` of 4 MB chunks). The time of the slowest
node, next to the link bound, says how close anything can get on this machine: the same
2 cores run the kernel's shaping, the TCP stacks of all hosts and these processes.
Prints one table line per repeat and ``MESH_RESULT {json}``.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PORT = 5300
CHUNK = 4 << 20

# One host's program: argv = role, own index, peers (comma list), bytes per peer, start time.
_NODE = r"""
import socket, sys, threading, time
role, peers, nbytes, start_at = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
CHUNK = %d
PORT = %d
buf = bytearray(CHUNK)

def pump_out(sock):
    left = nbytes
    view = memoryview(bytes(CHUNK))
    while left:
        n = min(left, CHUNK)
        sock.sendall(view[:n])
        left -= n
    sock.shutdown(socket.SHUT_WR)

def pump_in(sock):
    got, mine = 0, memoryview(bytearray(CHUNK))
    while got < nbytes:
        n = sock.recv_into(mine)
        if not n:
            raise SystemExit("short read")
        got += n

listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("", PORT))
listener.listen(64)
print("ready", flush=True)
socks = []
def accept_all():
    for _ in peers:
        s, _ = listener.accept()
        socks.append(s)
acceptor = threading.Thread(target=accept_all)
acceptor.start()
outs = []
time.sleep(max(0.0, start_at - time.time()))
for peer in peers:
    for _ in range(200):
        try:
            outs.append(socket.create_connection((peer, PORT)))
            break
        except OSError:
            time.sleep(0.05)
acceptor.join()
began = time.time()
threads = [threading.Thread(target=pump_out, args=(s,)) for s in outs]
threads += [threading.Thread(target=pump_in, args=(s,)) for s in socks]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done %%.4f" %% (time.time() - began), flush=True)
""" % (CHUNK, PORT)


def run_once(net, workers: int, servers: int, per_peer: int, timeout: float) -> float:
    worker_hosts = list(range(workers))
    server_hosts = list(range(workers, workers + servers))
    start_at = time.time() + 2.0
    procs = []
    for host in worker_hosts + server_hosts:
        peers = server_hosts if host in worker_hosts else worker_hosts
        argv = net.exec_argv(host) + [sys.executable, "-c", _NODE, "node",
                                      ",".join(net.address(p) for p in peers), str(per_peer),
                                      str(start_at)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    times = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done = [line for line in out.splitlines() if line.startswith("done ")]
            if proc.returncode != 0 or not done:
                raise SystemExit("a mesh node failed: %s" % err.strip()[-400:])
            times.append(float(done[0].split()[1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return max(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--mbytes", type=float, default=100.0, help="bytes per worker and step, MB")
    p.add_argument("--link-rate", default="1gbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    from kvstore_byteps.launcher.netns import (EmulatedNetwork, check_privileges,
                                               measure_link_rate, parse_rate)
    check_privileges()
    nbytes = int(args.mbytes * 1e6)
    per_peer = nbytes // args.servers
    with EmulatedNetwork(args.workers + args.servers, parse_rate(args.link_rate)) as net:
        rate = measure_link_rate(net, 0, 1, 50 * 10 ** 6)
        bound = nbytes * max(1.0, args.workers / args.servers) / rate
        print("load %.2f; link %.1f MB/s; %d workers x %d servers, %.1f MB per worker; "
              "link bound %.1f ms" % (os.getloadavg()[0], rate / 1e6, args.workers,
                                      args.servers, nbytes / 1e6, bound * 1e3), flush=True)
        results = []
        for i in range(args.repeats):
            seconds = run_once(net, args.workers, args.servers, per_peer, args.timeout)
            results.append(seconds)
            print("repeat %d: %.1f ms = %.0f%% of the link bound" % (i, seconds * 1e3,
                                                                     100 * bound / seconds),
                  flush=True)
    print("MESH_RESULT " + json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "workers": args.workers,
        "servers": args.servers, "bytes": nbytes, "link_rate_bytes_per_s": rate,
        "link_bound_s": bound, "times_s": results, "load": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Claims worker rank 0's node id (9) without any key and sends kStopServer to a server, as a
process on the network could: ``spoof_stop.py VAN HOST:PORT``. Keeps the connection open 5 s,
then prints ``SPOOF SENT``. A cluster must ignore it (zmq: ROUTER keeps the first identity;
byteps_tcp: van/tcp/claims.py)."""
import socket
import sys
import time

from kvstore_byteps.mxproto import ServerCommand
from kvstore_byteps.van.tcp import frame as tcp_frame
from kvstore_byteps.van.wire.codec import encode_meta
from kvstore_byteps.van.wire.message import Meta

WORKER0 = 9


def main():
    van, address = sys.argv[1], sys.argv[2]
    host, port = address.rsplit(":", 1)
    meta = encode_meta(Meta(head=ServerCommand.STOP_SERVER, request=True, simple_app=True,
                            app_id=0, customer_id=0, timestamp=1000, recver=8))
    if van == "zmq":
        import zmq
        sock = zmq.Context().socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"ps%d" % WORKER0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect("tcp://%s:%s" % (host, port))
        sock.send(meta)
    else:
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(tcp_frame.encode_hello(WORKER0))
        sock.recv(tcp_frame.HELLO_BYTES, socket.MSG_WAITALL)
        sock.sendall(tcp_frame.encode_header(meta, []) + meta)
    time.sleep(5)
    print("SPOOF SENT", flush=True)


main()

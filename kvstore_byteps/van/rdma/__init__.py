"""byteps_rdma: the RDMA van on byteps_tcp's handshake, its protocol without I/O, and the verbs providers."""

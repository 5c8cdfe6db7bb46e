"""Throwaway: start xllamacpp's llama.cpp HTTP server on 127.0.0.1:PORT with the tiny model; runs until killed."""
import sys, time, signal
import xllamacpp as x

port = int(sys.argv[2])
p = x.CommonParams()
p.model.path = sys.argv[1]
p.hostnames = ["127.0.0.1"]
p.port = port
p.n_parallel = 2
p.n_ctx = 4096
p.endpoint_metrics = True
p.model_alias = {sys.argv[3] if len(sys.argv) > 3 else "tiny"}
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
srv = x.Server(p)
print("listening", srv.listening_address, flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(1)

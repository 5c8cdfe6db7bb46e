import sys, time, signal
import xllamacpp as x
p = x.CommonParams()
p.model.path = sys.argv[1]; p.hostnames = ["127.0.0.1"]; p.port = int(sys.argv[2])
p.n_parallel = 1; p.n_ctx = 512; p.endpoint_metrics = True
p.api_keys = ["local-right-key"]
p.model_alias = {"tiny-b"}
p.cpuparams.n_threads = 1; p.cpuparams_batch.n_threads = 1
srv = x.Server(p)
print("listening", srv.listening_address, flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True: time.sleep(1)

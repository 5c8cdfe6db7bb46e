"""The real llama.cpp engine harness: a tiny random-weight model generated from a seed, the llama.cpp server
(xllamacpp wheel) started and stopped by PID, a bounded load driver that logs what a gateway would log, a /metrics
scraper, and named scenarios. Run ``python -m tools.engine --help``."""

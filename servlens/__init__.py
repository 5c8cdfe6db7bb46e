"""servlens: incident reports and release gates from LLM serving logs and engine metrics."""

__version__ = "0.1.0"

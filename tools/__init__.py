"""Developer tools for servlens (not installed with the package)."""

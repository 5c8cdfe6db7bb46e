"""The JSON Schema of each result document kind (package data), generated from servlens.documents."""

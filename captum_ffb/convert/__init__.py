"""Converters of model formats into transformers folders (tools, not run-time dependencies)."""

"""Workflows behind the CLI commands: load inputs, call the library, write outputs."""

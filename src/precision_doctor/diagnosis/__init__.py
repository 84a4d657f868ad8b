"""The diagnosis: assessment, decisions, root causes, hazards, noise, transformer headroom."""

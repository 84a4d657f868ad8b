"""Reports: JSON, terminal, HTML."""

"""Analysis: layerwise comparison, hazards, root causes, search."""

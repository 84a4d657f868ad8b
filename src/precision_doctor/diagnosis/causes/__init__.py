"""Causes: findings from the hazard scan and the layerwise table, their measured cures,
attribution, and the mechanisms' names (the taxonomy)."""

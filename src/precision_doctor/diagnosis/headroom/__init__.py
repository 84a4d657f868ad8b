"""Transformer headroom: LayerNorm/attention sites, their FP16 margins, the stress probe."""

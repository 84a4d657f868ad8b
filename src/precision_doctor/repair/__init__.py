"""``fix``: rewrite, rank, search, write, verify; and the review of the fixed model."""

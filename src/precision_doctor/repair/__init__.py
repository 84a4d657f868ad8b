"""``fix`` as named stages: baseline, rewrite, start plan, rank, search (``stages``), write,
verify (``verify``), chained by ``pipeline.fix`` into a ``FixResult`` (``result``); and the
review of the fixed model (``review``)."""

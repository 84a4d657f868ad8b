"""precision-doctor's benchmark suite: ``python -m benchmarks list`` / ``run NAME [args...]``.

Each benchmark is a script in this folder that backs a table of ``BENCHMARKS.md``; shared
helpers live in ``common.py`` (machine, versions, process measurement, results files).
One-off probes are in ``probes/`` (``probes/README.md``).
"""

"""``python -m precision_doctor`` runs the CLI (same as the ``precision-doctor`` command)."""

from precision_doctor.cli import app

app()

"""Decisions as the task reads them: which outputs carry decisions, and how their flips read."""

"""Outputs whose shape depends on the data: which output changed shape, which integer decision
changed it (a rounded duration, a count), near-tie or destroyed, and the measured cure."""

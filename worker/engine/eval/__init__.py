"""Held-out evaluation of the student: grading, and the eval run."""

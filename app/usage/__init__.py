"""Tokens each job used per UTC day, and the reports (by job, by day) with their
estimated cost from the price table."""

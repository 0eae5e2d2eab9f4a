"""Stored completions: what the completions doors served with `store: true`, kept per team
with the feedback given on them, listed and read through OpenAI's doors and read back as a
dataset source (`dataset.source: stored_completions`)."""

"""Sampling a job's checkpoint while the request waits: from the API, the dashboard's
Try it and the OpenAI-compatible routes, each answered once per Idempotency-Key."""

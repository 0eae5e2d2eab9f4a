"""The service side: job spec, settings, database models and the HTTP API (never imports torch)."""

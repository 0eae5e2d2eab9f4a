"""Settings and database plumbing shared by the API, the worker and the CLI."""

"""Sweeps: a search over a base spec's fields, whose trials are ordinary jobs of the team.
`schemas` defines one, `admission` admits it whole, `service` creates and shows it,
`control` (run by the workers' controller) starts trials, judges them at rungs
(`early_stopping`, pure) and ends the sweep; `search` proposes values (pure)."""

"""What a running job records as it goes, for the worker: its steps (and their block
summaries and usage), checkpoints, events and kept rollouts."""

"""The prompts a job trains and evaluates on: datasets, the arithmetic task, and the share
of every dataset that each step takes."""

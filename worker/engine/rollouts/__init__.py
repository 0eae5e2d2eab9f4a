"""Rollouts: the student's prompts, sampled completions with their logprobs, the sampler
clients that sample them, and the datums they become."""

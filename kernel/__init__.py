"""The shared kernel: the job spec, errors, retry/backoff and the data-root rule.

Every other package may import it; it imports none of them.
"""

"""Uploaded tables (JSONL, CSV, Parquet) read so that no file can take a process down:
bounds checked before and while reading (`bounds.py`), Arrow batches within them
(`reading.py`), and the whole read in a child with memory and CPU limits (`confined.py`).
The API inspects uploads this way and a worker checks a file this way before a job reads it."""

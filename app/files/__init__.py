"""Uploaded files: datasets a team sends over HTTP (POST /v1/files), checked when they
arrive (`inspection.py` reads them, `report.py` decides), stored by content in the object
store (kernel/storage/), named in specs as `dataset: {source: file, file: file-12}`."""

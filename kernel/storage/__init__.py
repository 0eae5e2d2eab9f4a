"""Where uploaded files (and the service's other objects) live: a folder or an S3 bucket,
named by one setting, OPD_STORAGE_URL. Both the API and the workers use it, so it sits in
the kernel (`blobs.py`: content-addressed objects; `cache.py`: a worker's bounded copies;
`hashing.py`: a file's sha256)."""

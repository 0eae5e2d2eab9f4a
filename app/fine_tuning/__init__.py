"""OpenAI's fine-tuning doors (`/v1/fine_tuning/jobs`) over the jobs of the rest of the
service: OpenAI's shapes (`schemas.py`), the mapping onto a job spec and back
(`mapping.py`), and the reads and the create use case (`service.py`)."""

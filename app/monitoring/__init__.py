"""What operators count at scrape time (Prometheus): jobs by status, live workers, steps
per minute."""

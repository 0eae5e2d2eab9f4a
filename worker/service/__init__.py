"""The worker's side of the service: the arq task, the database sink, the requeuer and the
worker process. It drives the engine and writes through the stores (`app.jobs.store`,
`app.records.store`).
"""

"""The API's resources, each operation written once (a generator of calls, see
transport.py) and run by whichever client it is reached through (base.py): `Client` runs
it and returns the result, `AsyncClient` returns a coroutine; list operations give an
iterator (an async one) that follows each page's cursor (`next_cursor`, or `last_id` while
`has_more`). One module per group of routes."""

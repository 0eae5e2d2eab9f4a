"""The API's resources, each operation written once (a generator of calls, see
transport.py) and run by whichever client it is reached through (base.py): `Client` runs
it and returns the result, `AsyncClient` returns a coroutine; list operations give an
iterator (an async one) that follows `next_cursor` from page to page. One module per group
of routes."""

"""The job store: every read and write of a job's state, for the API and the worker alike.

    queued -> running -> succeeded | failed | cancelled
    running -> cancelling -> cancelled      running -> pausing -> paused -> queued (resume)

`transitions` decides (pure); `jobs` applies a decision as one compare-and-set write plus an
event row; `records` appends what a run reports (steps, checkpoints, events); `dispatch`
keeps the queue's bookkeeping. The worker calls these functions and writes no SQL of its own.
"""

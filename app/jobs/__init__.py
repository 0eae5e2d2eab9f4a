"""Jobs: a team's distillation runs, from submission to their last checkpoint.

    queued -> running -> succeeded | failed | cancelled
    running -> cancelling -> cancelled      running -> pausing -> paused -> queued (resume)

`transitions` decides (pure); `store` applies a decision as one compare-and-set write plus an
event row; `dispatch` keeps the queue's bookkeeping; `admission` is the one way a spec
becomes a job and `service` the one use case that submits it, for every door.
"""

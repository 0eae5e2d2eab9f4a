"""The worker: the OPD engine (`engine/`: loop, datums, sinks, backends, datasets) and its
service glue (`service/`: the arq task, the database sink, the requeuer, the process)."""

import os

# MKL chooses code paths by memory alignment unless told otherwise, so two identical runs
# could differ in the last bits (and then in sampled tokens), while a job resumed after a
# crash must replay exactly what the first attempt computed. MKL reads this when it starts,
# and every process that runs the local backend imports this package before torch.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

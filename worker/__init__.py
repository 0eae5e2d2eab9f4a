"""The worker side: the OPD engine, its backends, datasets, metric sinks and the arq worker."""

import os

# MKL chooses code paths by memory alignment unless told otherwise, so two identical runs
# could differ in the last bits (and then in sampled tokens), while a job resumed after a
# crash must replay exactly what the first attempt computed. MKL reads this when it starts,
# and every process that runs the local backend imports this package before torch.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

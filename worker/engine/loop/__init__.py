"""The OPD loop and its phases: open a run, take its steps, save and resume exactly."""

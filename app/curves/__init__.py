"""A job's step metrics as charts read them: one row per step, block summaries over
aligned blocks of steps, and downsampled curves that never lose a spike."""

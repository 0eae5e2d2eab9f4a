"""The rollouts a job keeps (loop.keep_samples): each token with the teacher's view beside
the student's."""

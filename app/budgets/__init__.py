"""Money before and during a job: what a spec will cost (the estimate), and a team's budget
for a period, enforced where spending happens (submissions refused, running jobs paused at
a step boundary, resumed when the budget allows)."""

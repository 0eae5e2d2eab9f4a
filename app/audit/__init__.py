"""The audit log: every state-changing request, who made it, and the answer it got."""

"""Teams as an admin manages them: their limits and how many jobs each runs and queues."""

"""Webhooks: a team's subscriptions and the outbox of deliveries, staged in the
transaction that makes the event, sent and retried by the workers (worker/service/webhooks.py);
`urls` decides where a webhook may send."""

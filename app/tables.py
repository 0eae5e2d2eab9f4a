"""Every table of the service, registered in one metadata: a foreign key names its table
by string (a job's `sweep_id` names a table of a feature above jobs), so each process that
opens a database imports this module first (the API, the worker, the command line's
database commands, the migrations)."""

from app.audit.tables import AuditEntry
from app.auth.tables import ApiKey, Team
from app.budgets.tables import BudgetHold, TeamBudget
from app.core.tables import SQLModel
from app.curves.tables import MetricSummary, StepMetric
from app.files.tables import FileClaim, UploadedFile
from app.jobs.tables import Checkpoint, Event, Job, MlflowEnding
from app.playground.tables import Replay
from app.samples.tables import Sample
from app.stored_completions.tables import Feedback, StoredCompletion
from app.sweeps.tables import Sweep, SweepRung
from app.usage.tables import TeamSpendDay, UsageDay
from app.webhooks.tables import Webhook, WebhookAttempt, WebhookDelivery

__all__ = [
    "METADATA", "ApiKey", "AuditEntry", "BudgetHold", "Checkpoint", "Event", "Feedback",
    "FileClaim", "Job", "MetricSummary", "MlflowEnding", "Replay", "Sample", "StepMetric",
    "StoredCompletion", "Sweep", "SweepRung", "Team", "TeamBudget", "TeamSpendDay", "UploadedFile",
    "UsageDay", "Webhook", "WebhookAttempt", "WebhookDelivery",
]  # fmt: skip

METADATA = SQLModel.metadata

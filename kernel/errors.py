"""Errors a person can act on: each carries a stable code the service stores on the job."""

from __future__ import annotations


class OPDError(Exception):
    """A run failed for a reason the message explains; `code` is machine-readable."""

    code = "run_failed"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DatasetUnavailable(OPDError):
    code = "dataset_unavailable"


class TokenizerMismatch(OPDError):
    code = "tokenizer_mismatch"


class IncompatibleModels(TokenizerMismatch):
    """A teacher that cannot score the student's tokens as the student means them."""

    code = "incompatible_models"


class BackendFailure(OPDError):
    code = "backend_error"


class BackendAuth(BackendFailure):
    code = "backend_auth"


class BackendRejected(BackendFailure):
    code = "backend_rejected"


class BackendUnavailable(BackendFailure):
    code = "backend_unavailable"


class ServerAway(BackendUnavailable):
    """A server the run samples on stayed away past its retries: nothing it holds is the
    job's, so the service resumes the job from its last saved state on a later attempt."""


class ResultLost(BackendUnavailable):
    """A training call was sent and its result lost: it may have taken effect, so it must
    not be sent again; the service resumes the job from its last saved state instead."""


class FileTooComplex(OPDError):
    """A table past a bound its readers keep (nesting, a row's length, its size unpacked),
    refused before it is read whole (kernel/tables/bounds.py)."""

    code = "file_too_complex"


class FileUnreadable(OPDError):
    """A table whose reading crashed, or needed more memory or time than a reader may take
    (kernel/tables/confined.py)."""

    code = "file_unreadable"

"""The OPD job spec: one schema for the API, the CLI and the worker, one module per group.

Defaults equal the reference scripts' defaults; every count is bounded so that a spec can
neither divide by zero nor ask a shared service for unbounded work. `JobSpec` (job.py)
holds the groups and the rules that span them; `from kernel.spec import X` reaches every
public name of the groups.
"""

from kernel.spec.backends import LocalBackendSpec, TinkerBackendSpec, TrioBackendSpec
from kernel.spec.data import (
    ArithmeticDataset,
    DatasetSpec,
    DeepMathDataset,
    FileDataset,
    InlineDataset,
    PromptOptions,
    SharedDataset,
    StoredCompletionsDataset,
)
from kernel.spec.documents import (
    SpecError,
    format_validation_error,
    load_spec,
    parse_spec,
    stored_spec,
    validation_problems,
)
from kernel.spec.eval import EvalSpec
from kernel.spec.job import JobSpec
from kernel.spec.loop import LoopSpec, LossConfig, ObjectiveSpec, RewardSpec
from kernel.spec.optim import OptimSpec
from kernel.spec.sampling import SamplingSpec
from kernel.spec.student import InitFrom, SavedWeights, StudentSpec
from kernel.spec.teachers import MixedTeacher, TeacherServer, TeacherSpec
from kernel.spec.trackers import MlflowSpec, SwanLabSpec, TrackersSpec

__all__ = [
    "ArithmeticDataset",
    "DatasetSpec",
    "DeepMathDataset",
    "EvalSpec",
    "FileDataset",
    "InitFrom",
    "InlineDataset",
    "JobSpec",
    "LocalBackendSpec",
    "LoopSpec",
    "LossConfig",
    "MixedTeacher",
    "MlflowSpec",
    "ObjectiveSpec",
    "OptimSpec",
    "PromptOptions",
    "RewardSpec",
    "SamplingSpec",
    "SavedWeights",
    "SharedDataset",
    "SpecError",
    "StoredCompletionsDataset",
    "StudentSpec",
    "SwanLabSpec",
    "TeacherServer",
    "TeacherSpec",
    "TinkerBackendSpec",
    "TrackersSpec",
    "TrioBackendSpec",
    "format_validation_error",
    "load_spec",
    "parse_spec",
    "stored_spec",
    "validation_problems",
]

"""The prompt pool of a job: DeepMath-103K from ModelScope, a local file, a file the team
uploaded (read from the store into the worker's bounded cache), inline prompts, or
generated arithmetic problems. A file of conversations (by its rows' shape) gives the
prompts conversations.py takes from it.

DeepMath is fetched and sampled exactly as the reference scripts do (same shards, same
URL, same `datasets` reader, `shuffle(seed)` then the first `sample_size` rows), so a job
sees the reference's prompts in the reference's order. Rows whose prompt is null or blank
are dropped before shuffling (logged), because a chat prompt needs a question; on clean
data this changes nothing. Reference answers come along for eval: DeepMath's
`final_answer`, a file's `answer_field`, inline `answers`, or the arithmetic answers.
"""

from __future__ import annotations

import http.client
import logging
import os
import urllib.parse
import urllib.request
from csv import reader
from dataclasses import dataclass
from pathlib import Path

import pyarrow
from datasets import Dataset, Features, Value, load_dataset
from datasets.exceptions import DatasetsError
from tqdm import tqdm

from kernel.chats.files import ChatFormat, file_format
from kernel.datapaths import DataPathError, confine_data_path, resolve_data_path
from kernel.errors import DatasetUnavailable, OPDError
from kernel.spec import (
    ArithmeticDataset,
    DatasetSpec,
    DeepMathDataset,
    FileDataset,
    InlineDataset,
    JobSpec,
    SharedDataset,
    StoredCompletionsDataset,
)
from kernel.spec.data import DEEPMATH_SHARDS
from kernel.storage.blobs import BlobMissing
from kernel.storage.cache import BlobCache
from kernel.tables.bounds import TableLimits
from kernel.tables.reading import check_table
from worker.engine.data.arithmetic import Problem, held_out_problems, training_problems
from worker.engine.data.conversations import (
    check_file,
    file_holdout,
    file_prompts,
    stored_prompts,
)
from worker.engine.data.holdout import PoolName, held_out
from worker.engine.data.prompts import Prompt, Prompts

logger = logging.getLogger(__name__)

MODELSCOPE_BASE = "https://www.modelscope.cn"
DEFAULT_DEEPMATH = DeepMathDataset()
DOWNLOAD_CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_SECONDS = 60
PARQUET_MAGIC = b"PAR1"
FILE_LOADERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
CHAT_KINDS = {".parquet": "parquet", ".jsonl": "jsonl"}
"""The files that may hold conversations (one a row), by suffix (an upload's is its kind)."""
UPLOAD_LOADERS = {**FILE_LOADERS, ".csv": "csv"}
TEXT_TYPES = ("string", "large_string")
DEEPMATH_ANSWERS = "final_answer"


@dataclass(frozen=True)
class Table:
    """A tabular source: its rows, the prompt and answer columns, and a name for messages."""

    rows: Dataset
    field: str
    answer_field: str | None
    name: str
    seed: int
    sample_size: int | None


def load_prompts(
    dataset: DatasetSpec,
    data_root: Path,
    confine: bool,
    blobs: BlobCache | None = None,
    feedback_only: bool = False,
) -> Prompts:
    """The job's training prompts, in the order the loop takes them (step-wise, wrapping
    around): the reference's sampling, shuffle with the seed then the first sample_size;
    stored completions in the order they were stored (those without feedback left out
    where `feedback_only`)."""
    if isinstance(dataset, StoredCompletionsDataset):
        return stored_prompts(dataset, feedback_only)
    if isinstance(dataset, InlineDataset):
        keep = nonblank(dataset.prompts, "dataset.prompts")
        answers = dataset.answers or [None] * len(dataset.prompts)
        return Prompts([dataset.prompts[i] for i in keep], [answers[i] for i in keep])
    if isinstance(dataset, ArithmeticDataset):
        return problem_prompts(training_problems(dataset))
    chats = chat_file(dataset, data_root, confine, blobs)
    if chats is not None:
        return file_prompts(*chats, table_limits(blobs))
    table = open_table(dataset, data_root, confine, blobs)
    rows = shuffled(table)
    if table.sample_size is not None:
        rows = rows.select(range(min(table.sample_size, len(rows))))
    return prompts_of(rows, table)


def load_datasets(
    spec: JobSpec, data_root: Path, confine: bool, blobs: BlobCache | None = None
) -> dict[str, Prompts]:
    """Every dataset's training prompts, by name (`dataset:` goes by "dataset")."""
    return {
        share.name: load_prompts(share, data_root, confine, blobs, reads_feedback(spec, share))
        for share in spec.dataset_shares()
    }


def reads_feedback(spec: JobSpec, share: SharedDataset) -> bool:
    """Whether a teacher that scores the dataset's prompts reads their feedback."""
    route = spec.route_of(share)
    teachers = spec.teacher_specs()
    scoring = [teachers[route]] if route is not None else list(teachers.values())
    return any(t.self is not None and t.self.context == "feedback" for t in scoring)


def load_holdout(
    dataset: DatasetSpec,
    count: int,
    seed: int,
    data_root: Path,
    confine: bool,
    blobs: BlobCache | None = None,
) -> Prompts:
    """`count` prompts, drawn with `seed` from the rows the training pool does not use, so
    an eval never sees a training prompt and never changes the training pool."""
    if isinstance(dataset, InlineDataset | StoredCompletionsDataset):
        raise OPDError(
            f"eval.holdout cannot draw from {dataset.source} prompts (they all train): give "
            "eval a dataset of its own",
            code="bad_eval",
        )
    if isinstance(dataset, ArithmeticDataset):
        return problem_prompts(held_out_problems(dataset, count, seed))
    chats = chat_file(dataset, data_root, confine, blobs)
    if chats is not None:
        return file_holdout(*chats, count, seed, table_limits(blobs))
    table = open_table(dataset, data_root, confine, blobs)
    rows = shuffled(table)
    pool = PoolName("prompts", table.name, "rows ")
    return prompts_of(rows.select(held_out(len(rows), table.sample_size, count, seed, pool)), table)


def problem_prompts(problems: list[Problem]) -> Prompts:
    return Prompts([p.question for p in problems], [p.answer for p in problems])


def table_limits(blobs: BlobCache | None) -> TableLimits:
    """The bounds a dataset file is read within: the uploads' (a file under the data root
    is the operator's, read within the defaults)."""
    return blobs.table_limits if blobs is not None else TableLimits()


def file_of(dataset: FileDataset, data_root: Path, confine: bool, blobs: BlobCache | None) -> Path:
    """Where a file dataset's file lies here: an upload fetched from the store (and
    checked), or a file under the data root."""
    if dataset.file:
        return uploaded(dataset, blobs)
    return locate(dataset.path or "", data_root, confine)


def chat_file(
    dataset: DeepMathDataset | FileDataset,
    data_root: Path,
    confine: bool,
    blobs: BlobCache | None,
) -> tuple[Path, str, ChatFormat, FileDataset] | None:
    """A file of conversations (by its rows' shape): where it lies, its kind and format,
    and the dataset; None for a table of questions."""
    if not isinstance(dataset, FileDataset):
        return None
    path = file_of(dataset, data_root, confine, blobs)
    kind = CHAT_KINDS.get(path.suffix.lower())
    found = None if kind is None else chat_format(path, kind, table_limits(blobs))
    return None if found is None or kind is None else (path, kind, found, dataset)


def chat_format(path: Path, kind: str, limits: TableLimits) -> ChatFormat | None:
    """The format of a file that may hold conversations (a JSONL or Parquet file)."""
    return file_format(path, kind, limits) if kind in CHAT_KINDS.values() else None


def open_table(
    dataset: DeepMathDataset | FileDataset,
    data_root: Path,
    confine: bool,
    blobs: BlobCache | None = None,
) -> Table:
    if isinstance(dataset, DeepMathDataset):
        rows = read_deepmath(dataset, data_root)
        answers = DEEPMATH_ANSWERS if DEEPMATH_ANSWERS in rows.column_names else None
        return Table(rows, "question", answers, "DeepMath", dataset.seed, dataset.sample_size)
    path = file_of(dataset, data_root, confine, blobs)
    name = dataset.where()
    rows = read_table(UPLOAD_LOADERS[path.suffix.lower()], [path], data_root / "datasets", name)
    return Table(rows, dataset.field, dataset.answer_field, name, dataset.seed, dataset.sample_size)


def uploaded(dataset: FileDataset, blobs: BlobCache | None) -> Path:
    """The local copy of an uploaded file, fetched from the store into the worker's cache."""
    if blobs is None or dataset.blob is None:
        raise OPDError(
            f"dataset file {dataset.file} is an uploaded file: only the service's workers read "
            "those (submit the job to the service, or give path: instead)",
            code="bad_dataset",
        )
    sha256, suffix = dataset.blob.split(".")
    try:
        path = blobs.path(sha256, f".{suffix}")
    except BlobMissing as error:
        raise DatasetUnavailable(f"{dataset.file} is no longer in the store: {error}") from error
    format = (
        file_format(path, suffix, blobs.table_limits) if suffix in CHAT_KINDS.values() else None
    )
    if format is None:  # a file no reader survives fails the job
        check_table(path, suffix, blobs.table_limits)
    else:
        check_file(path, suffix, format, blobs.table_limits)
    return path


def nonblank(values: list[str | None], where: str) -> list[int]:
    """Indices of the usable prompts; an all-empty source is an error, not an empty run."""
    keep = [i for i, value in enumerate(values) if value is not None and value.strip()]
    if not keep:
        raise OPDError(f"{where} has no non-empty prompts", code="bad_dataset")
    if len(keep) < len(values):
        logger.warning("Skipped %d null or blank prompts in %s", len(values) - len(keep), where)
    return keep


def require_text_column(table: Table, column: str, setting: str) -> None:
    rows = table.rows
    if column not in rows.column_names:
        raise OPDError(
            f"{table.name} has no column {column!r}; its columns are {rows.column_names}. "
            f"Set {setting} to the column that holds them",
            code="bad_dataset",
        )
    feature = rows.features[column]
    if feature != Value("null") and not (
        isinstance(feature, Value) and feature.dtype in TEXT_TYPES
    ):
        raise OPDError(
            f"column {column!r} of {table.name} holds {feature}, not text; "
            f"set {setting} to a column of strings",
            code="bad_dataset",
        )


def shuffled(table: Table) -> Dataset:
    """The rows with a usable prompt, shuffled with the seed as the reference shuffles."""
    require_text_column(table, table.field, "dataset.field")
    if table.answer_field is not None:
        require_text_column(table, table.answer_field, "dataset.answer_field")
    values = list(table.rows[table.field])
    keep = nonblank(values, f"column {table.field!r} of {table.name}")
    rows = table.rows if len(keep) == len(values) else table.rows.select(keep)
    return rows.shuffle(seed=table.seed)


def prompts_of(rows: Dataset, table: Table) -> Prompts:
    questions: list[Prompt] = list(rows[table.field])
    if table.answer_field is None:
        return Prompts(questions, [None] * len(questions))
    return Prompts(questions, list(rows[table.answer_field]))


def locate(path: str, data_root: Path, confine: bool) -> Path:
    """A dataset file's real location; the service (`confine`) only reads under data_root."""
    try:
        resolved = (confine_data_path if confine else resolve_data_path)(path, data_root)
    except DataPathError as error:
        raise OPDError(str(error), code="bad_dataset_path") from error
    if resolved.suffix.lower() not in FILE_LOADERS:
        raise OPDError(
            f"dataset path {path!r} is not a .parquet, .jsonl or .json file",
            code="bad_dataset",
        )
    if not resolved.is_file():
        where = "under the server's data root" if confine else f"(looked for {resolved})"
        raise DatasetUnavailable(f"dataset file {path!r} does not exist {where}")
    return resolved


def read_table(loader: str, files: list[Path], cache_root: Path, name: str) -> Dataset:
    """Read local files with `datasets`' own reader, as the reference does (an uploaded
    CSV's columns all as text, as its upload was checked)."""
    try:
        return load_dataset(
            loader,
            data_files=[str(file) for file in files],
            split="train",
            cache_dir=str(cache_root / ".datasets_cache"),
            **({"features": text_features(files[0])} if loader == "csv" else {}),
        )
    except (DatasetsError, pyarrow.ArrowException, OSError) as error:
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise DatasetUnavailable(f"cannot read {name} as {loader}: {error}{cause}") from error


def text_features(csv: Path) -> Features:
    """Every column of the CSV as text (its header names them)."""
    with csv.open(encoding="utf-8", newline="") as source:
        header = next(reader(source), [])
    return Features({name: Value("string") for name in header})


def deepmath_folder(dataset: DeepMathDataset, data_root: Path) -> Path:
    """The reference's folder for the default source; any other repo or revision gets a
    sub-folder of its own, so shards of different sources never mix."""
    folder = data_root / "datasets" / "DeepMath-103K"
    if (dataset.repo, dataset.revision) == (DEFAULT_DEEPMATH.repo, DEFAULT_DEEPMATH.revision):
        return folder
    return folder / urllib.parse.quote(f"{dataset.repo}@{dataset.revision}", safe="")


def shard_name(index: int) -> str:
    return f"data/train-{index:05d}-of-{DEEPMATH_SHARDS:05d}.parquet"


def modelscope_file_url(repo: str, revision: str, file_path: str) -> str:
    """ModelScope's repo file endpoint, built as the reference builds it."""
    namespace, name = repo.split("/", 1)
    query = urllib.parse.urlencode(
        {"Source": "SDK", "Revision": revision, "FilePath": file_path, "View": "False"}
    )
    return f"{MODELSCOPE_BASE}/api/v1/datasets/{namespace}/{name}/repo?{query}"


def read_deepmath(dataset: DeepMathDataset, data_root: Path) -> Dataset:
    folder = deepmath_folder(dataset, data_root)
    where = f"the data root's {(folder / 'data').relative_to(data_root).as_posix()} folder"
    shards = []
    for index in range(dataset.num_shards):
        shard = folder / shard_name(index)
        if not shard.is_file():
            url = modelscope_file_url(dataset.repo, dataset.revision, shard_name(index))
            download(url, shard, where)
        shards.append(shard)
    return read_table("parquet", shards, folder, f"the DeepMath shards in {where}")


def download(url: str, target: Path, where: str) -> None:
    """Fetch one shard into a private .tmp file, then rename it into place, so a crash or a
    second worker never leaves a half-written shard that looks finished. `where` names the
    shards' folder in the failure's message without the server's path (the job's error is
    read by its team, wherever they are; the operator knows the data root)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    request = urllib.request.Request(url, headers={"User-Agent": "opd-service"})
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:
            size = response.headers.get("Content-Length")
            with (
                tmp.open("wb") as out,
                tqdm(
                    total=int(size) if size else None,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=f"Downloading {target.name}",
                ) as bar,
            ):
                while chunk := response.read(DOWNLOAD_CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
        with tmp.open("rb") as written:
            if written.read(len(PARQUET_MAGIC)) != PARQUET_MAGIC:
                raise DatasetUnavailable(
                    f"{url} did not return a parquet file; the repo or revision may not exist"
                )
        tmp.replace(target)
    except (OSError, http.client.HTTPException) as error:
        host = urllib.parse.urlsplit(url).hostname
        raise DatasetUnavailable(
            f"cannot download DeepMath shard {target.name} from {host}: "
            f"{getattr(error, 'reason', error)}. Check that this machine can reach {host}, "
            f"or download the shards elsewhere and either place them in {where} "
            "or point the job at them with `dataset: {source: file, path: ...}`"
        ) from error
    finally:
        tmp.unlink(missing_ok=True)

"""The prompt pool of a job: DeepMath-103K from ModelScope, a local file, or inline prompts.

DeepMath is fetched and sampled exactly as the reference scripts do (same shards, same
URL, same `datasets` reader, `shuffle(seed)` then the first `sample_size` rows), so a job
sees the reference's prompts in the reference's order. Rows whose prompt is null or blank
are dropped before shuffling (logged), because a chat prompt needs a question; on clean
data this changes nothing.
"""

from __future__ import annotations

import http.client
import logging
import os
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow
from datasets import Dataset, Value, load_dataset
from datasets.exceptions import DatasetsError
from tqdm import tqdm

from kernel.datapaths import DataPathError, confine_data_path, resolve_data_path
from kernel.errors import DatasetUnavailable, OPDError
from kernel.spec import DEEPMATH_SHARDS, DeepMathDataset, FileDataset, InlineDataset

logger = logging.getLogger(__name__)

MODELSCOPE_BASE = "https://www.modelscope.cn"
DEFAULT_DEEPMATH = DeepMathDataset()
DOWNLOAD_CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_SECONDS = 60
PARQUET_MAGIC = b"PAR1"
FILE_LOADERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
TEXT_TYPES = ("string", "large_string")


def load_prompts(
    dataset: DeepMathDataset | FileDataset | InlineDataset, data_root: Path, confine: bool
) -> list[str]:
    """The job's prompts, in the order the loop takes them (step-wise, wrapping around)."""
    if isinstance(dataset, InlineDataset):
        return [dataset.prompts[i] for i in nonblank(dataset.prompts, "dataset.prompts")]
    if isinstance(dataset, DeepMathDataset):
        return load_deepmath(dataset, data_root)
    path = locate(dataset.path, data_root, confine)
    table = read_table(
        FILE_LOADERS[path.suffix.lower()], [path], data_root / "datasets", dataset.path
    )
    return sample_prompts(table, dataset.field, dataset.seed, dataset.sample_size, dataset.path)


def nonblank(values: list[str | None], where: str) -> list[int]:
    """Indices of the usable prompts; an all-empty source is an error, not an empty run."""
    keep = [i for i, value in enumerate(values) if value is not None and value.strip()]
    if not keep:
        raise OPDError(f"{where} has no non-empty prompts", code="bad_dataset")
    if len(keep) < len(values):
        logger.warning("Skipped %d null or blank prompts in %s", len(values) - len(keep), where)
    return keep


def sample_prompts(
    table: Dataset, field: str, seed: int, sample_size: int | None, name: str
) -> list[str]:
    """The reference's sampling: shuffle with the seed, then keep the first sample_size."""
    if field not in table.column_names:
        raise OPDError(
            f"{name} has no column {field!r}; its columns are {table.column_names}. "
            "Set dataset.field to the column that holds the prompts",
            code="bad_dataset",
        )
    feature = table.features[field]
    if feature != Value("null") and not (
        isinstance(feature, Value) and feature.dtype in TEXT_TYPES
    ):
        raise OPDError(
            f"column {field!r} of {name} holds {feature}, not text; "
            "set dataset.field to a column of prompt strings",
            code="bad_dataset",
        )
    values = list(table[field])
    keep = nonblank(values, f"column {field!r} of {name}")
    if len(keep) < len(values):
        table = table.select(keep)
    table = table.shuffle(seed=seed)
    if sample_size is not None:
        table = table.select(range(min(sample_size, len(table))))
    return list(table[field])


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
    """Read local files with `datasets`' own reader, as the reference does."""
    try:
        return load_dataset(
            loader,
            data_files=[str(file) for file in files],
            split="train",
            cache_dir=str(cache_root / ".datasets_cache"),
        )
    except (DatasetsError, pyarrow.ArrowException, OSError) as error:
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise DatasetUnavailable(f"cannot read {name} as {loader}: {error}{cause}") from error


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


def load_deepmath(dataset: DeepMathDataset, data_root: Path) -> list[str]:
    folder = deepmath_folder(dataset, data_root)
    shards = []
    for index in range(dataset.num_shards):
        shard = folder / shard_name(index)
        if not shard.is_file():
            url = modelscope_file_url(dataset.repo, dataset.revision, shard_name(index))
            download(url, shard, folder)
        shards.append(shard)
    table = read_table("parquet", shards, folder, f"DeepMath shards in {folder}")
    return sample_prompts(table, "question", dataset.seed, dataset.sample_size, "DeepMath")


def download(url: str, target: Path, folder: Path) -> None:
    """Fetch one shard into a private .tmp file, then rename it into place, so a crash or a
    second worker never leaves a half-written shard that looks finished."""
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
            f"or download the shards elsewhere and either place them in {folder / 'data'} "
            "or point the job at them with `dataset: {source: file, path: ...}`"
        ) from error
    finally:
        tmp.unlink(missing_ok=True)

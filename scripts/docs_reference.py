"""The documentation site's reference pages, generated from the code at build time
(mkdocs-gen-files runs this; `mkdocs build --strict` in CI), so they cannot drift: every
job-spec field from the pydantic models, every command from the CLI's parser, every setting
from the settings class, the HTTP API from the OpenAPI document, and the error codes and
metric names from their registries.

`python scripts/docs_reference.py OUT` writes the same pages into the folder OUT."""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.core.config import UNDER_HOME, Settings
from app.main import create_app
from kernel.error_codes import ERROR_CODES
from kernel.metric_names import METRICS
from kernel.spec import JobSpec
from opd.cli.entry import build_parser

Page = tuple[str, str]


def spec_page() -> str:
    lines = [
        "# Job spec",
        "",
        "Every field of a job spec (`kernel/spec/`), as the API, `opd run` and the worker read",
        "it. A field not written takes its default; bounds are enforced at submission (a 422",
        "that names the field). *Backends* says which backends read a field: the `local`,",
        "`trio` and `tinker` groups belong to theirs; what a backend cannot train (an",
        "objective, a teacher mode) is refused at submission, the field's text says so.",
        "",
        "## Top level",
        "",
    ]
    top, *groups = spec_sections()
    lines += field_table(top[2])
    for group, info, rows in groups:
        lines += [f"## `{group}`", "", *described(info), ""]
        lines += field_table(rows)
    return "\n".join(lines)


def spec_sections() -> list[tuple[str, FieldInfo | None, list[tuple[str, FieldInfo]]]]:
    """The spec page's sections: the top-level fields, then each group (its name, its field
    and the (dotted path, field) of everything in it)."""
    groups = {n: i for n, i in JobSpec.model_fields.items() if models_in(i.annotation)}
    top = [(n, i) for n, i in JobSpec.model_fields.items() if n not in groups and not i.exclude]
    return [
        ("", None, top),
        *((group, info, list(fields_of(group, info))) for group, info in groups.items()),
    ]


BACKEND_GROUPS = ("local", "trio", "tinker")


def backends_of(path: str, info: FieldInfo) -> str:
    """Which backends read a field: its group's (`local.*`, ...), those its schema names
    (`json_schema_extra={"backends": [...]}`), else all."""
    group = path.split(".")[0]
    if group in BACKEND_GROUPS:
        return group
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    named = extra.get("backends")
    return ", ".join(named) if isinstance(named, list) else "all"


def fields_of(path: str, info: FieldInfo) -> Iterator[tuple[str, FieldInfo]]:
    """(dotted path, field) of a field and, for a group, of each field inside it (a union of
    groups, such as the dataset sources, gives each member's fields under its name)."""
    if info.exclude:  # withdrawn from specs (read as absent), so not one to write
        return
    models = models_in(info.annotation)
    if not models:
        yield path, info
        return
    for model in models:
        prefix = path if len(models) == 1 else f"{path} ({source_of(model)})"
        for name, inner in model.model_fields.items():
            yield from fields_of(f"{prefix}.{name}", inner)


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, unions, Annotated, dict
    values and list items), in their order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        for model in models_in(argument):
            if model not in found:
                found.append(model)
    return found


def source_of(model: type[BaseModel]) -> str:
    source = model.model_fields.get("source")
    return f"source: {source.default}" if source is not None else model.__name__


def field_table(rows: list[tuple[str, FieldInfo]]) -> list[str]:
    table = [
        "| field | type | default | allowed | backends | what it is |",
        "|---|---|---|---|---|---|",
    ]
    for path, info in rows:
        cells = [f"`{path}`", type_name(info.annotation), default_of(info), bounds_of(info)]
        cells += [backends_of(path, info), cell(info.description or "")]
        table.append("| " + " | ".join(cells) + " |")
    return [*table, ""]


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(argument) for argument in typing.get_args(annotation))
    if origin is not None:
        arguments = ", ".join(type_name(argument) for argument in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{arguments}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def default_of(info: FieldInfo) -> str:
    if info.default_factory is not None:
        made = info.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(made, BaseModel) else f"`{json.dumps(made)}`"
    if info.default is PydanticUndefined:
        return "required"
    value = info.default
    if isinstance(value, BaseModel):
        return ""
    return f"`{json.dumps(value, default=str)}`"


BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=",
          "max_length": "length <=", "pattern": "matches"}  # fmt: skip


def bounds_of(info: FieldInfo) -> str:
    found = []
    for item in info.metadata:
        for name, words in BOUNDS.items():
            value = getattr(item, name, None)
            if value is not None:
                found.append(f"{words} `{value}`")
    return cell(", ".join(found))


def described(info: FieldInfo) -> list[str]:
    models = models_in(info.annotation)
    doc = info.description or (models[0].__doc__ if len(models) == 1 else None) or ""
    return [prose(" ".join(doc.split()))] if doc else []


CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose(text: str) -> str:
    """Markdown text as the page must hold it: outside code spans, `<home>` and `<url>` as
    text (not HTML tags the browser swallows); code spans as written."""
    kept = CODE_SPAN.split(text)
    out = []
    for index, part in enumerate(kept):
        if index % 3 == 0:
            out.append(part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
        elif index % 3 == 2:
            out.append(f"{kept[index - 1]}{part}{kept[index - 1]}")
    return "".join(out)


def cell(text: str) -> str:
    """A table cell: one line, its pipes escaped where they would end the cell (a code
    span's need no escape, and would show the backslash)."""
    kept = CODE_SPAN.split(prose(" ".join(text.split())))
    return "".join(
        part.replace("|", "\\|") if index % 3 == 0 else f"{kept[index - 1]}{part}{kept[index - 1]}"
        for index, part in enumerate(kept)
        if index % 3 != 1
    )


def cli_page() -> str:
    lines = [
        "# Command line",
        "",
        "Every `opd` command, with its help as `opd COMMAND --help` prints it",
        "(`opd/cli/`). The client commands talk to the service over HTTP (`--url`/`OPD_URL`,",
        "`OPD_API_KEY`); `serve`, `api`, `worker`, `migrate`, `run` and `keys` need the",
        "`server` extra.",
        "",
    ]
    for path, parser in parsers(build_parser(), ["opd"]):
        lines += [f"## `{' '.join(path)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def parsers(
    parser: argparse.ArgumentParser, path: list[str]
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, [*path, name])


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        "The service reads its settings from `OPD_*` environment variables (or a `.env` file",
        "in the folder it starts in; `app/core/config.py`). Paths default to places under",
        "`OPD_HOME`.",
        "",
        "| variable | type | default | allowed | what it is |",
        "|---|---|---|---|---|",
    ]
    for name, info in Settings.model_fields.items():
        default = default_of(info)
        if name in UNDER_HOME:
            default = f"`{UNDER_HOME[name].format(home='$OPD_HOME')}`"
        cells = [f"`OPD_{name.upper()}`", type_name(info.annotation), default]
        cells += [bounds_of(info), cell(info.description or "")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def http_page() -> str:
    document = create_app().openapi()
    lines = [
        "# HTTP API",
        "",
        "Every route of the API (`/v1`), from its OpenAPI document: the running service serves",
        "the same document at `/openapi.json` and an interactive page at `/docs`. Errors have",
        'one shape: `{"error": {"code", "message", "param"}}` ([error codes](errors.md)).',
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            tag = (operation.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method.upper(), path, operation))
    for tag, operations in sorted(by_tag.items()):
        lines += [f"## {tag}", ""]
        for method, path, operation in operations:
            lines += [f"### `{method} {path}`", ""]
            if summary := operation.get("summary"):
                lines += [f"**{prose(summary)}**", ""]
            if description := operation.get("description"):
                lines += [prose(description.strip()), ""]
            lines += parameter_table(operation.get("parameters", []))
            if body := operation.get("requestBody"):
                lines += [f"Body: {schema_names(body.get('content', {}))}", ""]
            statuses = ", ".join(f"`{code}`" for code in operation.get("responses", {}))
            lines += [f"Answers: {statuses}", ""]
    return "\n".join(lines)


def parameter_table(parameters: list[dict[str, Any]]) -> list[str]:
    if not parameters:
        return []
    table = ["| parameter | in | required | what it is |", "|---|---|---|---|"]
    for parameter in parameters:
        required = "yes" if parameter.get("required") else ""
        what = cell(parameter.get("description", ""))
        table.append(f"| `{parameter['name']}` | {parameter['in']} | {required} | {what} |")
    return [*table, ""]


def schema_names(content: dict[str, Any]) -> str:
    names = []
    for media, entry in content.items():
        reference = entry.get("schema", {}).get("$ref", "")
        names.append(f"`{media}`" + (f" ({reference.rsplit('/', 1)[-1]})" if reference else ""))
    return ", ".join(names)


def errors_page() -> str:
    lines = [
        "# Error codes",
        "",
        "Every error code the service answers with or records on a failed job",
        "(`kernel/error_codes.py`; a test keeps it complete). A request's error is",
        '`{"error": {"code", "message", "param"}}`; a failed job\'s is `{code, message}`.',
        "",
        "| code | where | what it means, and what to do |",
        "|---|---|---|",
    ]
    for code, (where, meaning) in sorted(ERROR_CODES.items()):
        lines.append(f"| `{code}` | {where} | {cell(meaning)} |")
    return "\n".join(lines) + "\n"


def metrics_page() -> str:
    lines = [
        "# Metric names",
        "",
        "Every metric a job records, by the name people chart (`kernel/metric_names.py`; a",
        "test checks that a run records nothing it does not list). `<dataset>` and `<teacher>`",
        "are the names a spec gives them, with several datasets or teachers.",
        "",
        "| metric | what it is |",
        "|---|---|",
    ]
    for name, meaning in METRICS.items():
        lines.append(f"| `{name}` | {cell(meaning)} |")
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/spec.md": spec_page,
    "reference/cli.md": cli_page,
    "reference/settings.md": settings_page,
    "reference/http-api.md": http_page,
    "reference/errors.md": errors_page,
    "reference/metrics.md": metrics_page,
}


def pages() -> Iterator[Page]:
    for path, make in PAGES.items():
        yield path, make()


def build_site() -> None:
    """mkdocs-gen-files' entry: the pages as files of the site."""
    import mkdocs_gen_files

    for path, text in pages():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text)


if __name__ == "<run_path>":  # mkdocs-gen-files runs it so
    build_site()
elif __name__ == "__main__":
    out = Path(sys.argv[1])
    for path, text in pages():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)

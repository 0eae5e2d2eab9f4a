"""`opd files upload PATH | list | show ID | download ID OUT | rm ID`: the team's uploaded
datasets, through the SDK. A spec names one as `dataset: {source: file, file: file-12}`."""

from __future__ import annotations

import argparse
import json
from itertools import islice
from typing import TYPE_CHECKING

from app.files.schemas import FileDetail, FilePublic
from opd.cli.common import api_options, client, count, example, page_size

if TYPE_CHECKING:
    from opd.cli.common import Commands


def file_line(file: FilePublic) -> str:
    answers = file.answer_field or "-"
    return (
        f"{file.id:>10}  {file.format:<7} {file.bytes:>12} B {file.rows:>9} rows  "
        f"question={file.question_field} answer={answers}  {file.filename}"
    )


def report_lines(file: FileDetail) -> list[str]:
    report = file.report
    columns = ", ".join(f"{column.name} ({column.type})" for column in report.columns)
    return [
        file_line(file),
        f"sha256: {file.sha256}",
        f"columns: {columns}",
        *chat_lines(file),
        f"empty questions: {report.empty_questions}; "
        f"duplicate questions: {report.duplicate_questions}",
        "preview:",
        *(f"  {json.dumps(row, ensure_ascii=False)}" for row in report.preview),
    ]


def chat_lines(file: FileDetail) -> list[str]:
    """A file of conversations: its format and what its conversations hold."""
    chat = file.report.chat
    if chat is None:
        return []
    roles = ", ".join(f"{role} {count}" for role, count in chat.roles.items())
    tokens = f", {chat.longest_tokens} tokens of {chat.tokens_of}" if chat.tokens_of else ""
    return [
        f"conversations ({chat.format}): {chat.conversations}; messages: {roles}; tool calls: "
        f"{chat.tool_calls}",
        f"prompts: {chat.prompts_last} with turns: last, {chat.prompts_each} with turns: each; "
        f"longest: {chat.longest_chars} characters{tokens}",
    ]


def files_command(args: argparse.Namespace) -> int:
    api = client(args)
    if args.files_action == "upload":
        file = api.files.upload(
            args.path,
            field=args.field,
            answer_field=args.answer_field,
            format=args.format,
            model=args.model,
            progress=not args.quiet,
            idempotency_key=args.idempotency_key,
        )
        print(file.id if args.quiet else "\n".join(report_lines(file)))
    elif args.files_action == "list":
        listed = list(islice(api.files.list(page_size=page_size(args.limit, 100)), args.limit))
        print("\n".join(map(file_line, listed)) if listed else "no files (opd files upload PATH)")
    elif args.files_action == "show":
        print("\n".join(report_lines(api.files.get(args.file))))
    elif args.files_action == "download":
        saved = api.files.download(args.file, args.out)
        print(f"Wrote {saved.path} (sha256 {saved.sha256})")
    else:
        api.files.delete(args.file)
        print(f"Deleted {args.file}")
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    files = commands.add_parser("files", help="datasets uploaded to the service")
    actions = files.add_subparsers(dest="files_action", required=True, metavar="ACTION")
    upload = actions.add_parser(
        "upload", parents=[http], help="upload a JSONL, Parquet or CSV file and show its report"
    )
    upload.add_argument("path", help="a JSONL, Parquet or CSV file")
    upload.add_argument("--field", help="the column of questions (default: guessed)")
    upload.add_argument("--answer-field", help="the column of reference answers (default: guessed)")
    upload.add_argument(
        "--format", choices=["jsonl", "parquet", "csv"], help="default: from the name"
    )
    upload.add_argument(
        "--model",
        help="conversations: the model whose tokens the report counts the longest one in",
    )
    upload.add_argument("--quiet", action="store_true", help="no progress bar; print the id only")
    upload.add_argument(
        "--idempotency-key", help="uploading again with the same key and file is safe"
    )
    example(upload, "opd files upload train.jsonl --field question --answer-field answer")
    listing = actions.add_parser("list", parents=[http], help="the team's files, newest first")
    listing.add_argument("--limit", type=count, default=20, help="how many (default 20)")
    example(listing, "opd files list")
    for name, text in (
        ("show", "a file's report and preview"),
        ("rm", "delete a file (refused while an unfinished job reads it)"),
    ):
        action = actions.add_parser(name, parents=[http], help=text)
        action.add_argument("file", help="its id, file-N")
        example(action, f"opd files {name} file-1")
    download = actions.add_parser("download", parents=[http], help="a file's bytes, as uploaded")
    download.add_argument("file", help="its id, file-N")
    download.add_argument("out", help="where to write them")
    example(download, "opd files download file-1 copy.jsonl")
    files.set_defaults(handler=files_command)

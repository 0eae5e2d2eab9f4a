"""OpenAI's upload form: a `multipart/form-data` body with a `file` part and a few text
fields (`purpose`, and this service's `format`, `field`, `answer_field`, `model`), read as it
arrives with python-multipart's streaming parser. The fields before the file are gathered
(each small, the form's bytes besides the file bounded), the file's bytes are passed on
chunk by chunk, for the upload to spool as it spools a raw body (with its limits, as they
arrive), and what follows them is read to the closing boundary. Nothing of the file is
held in memory; a body that is not such a form is a 400 or 422 that says why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.files.errors import FileRefused
from app.files.names import MAX_FILENAME_CHARS
from app.files.schemas import DEFAULT_PURPOSE, FileFormat, UploadForm
from app.files.service import Upload
from kernel.wording import one_line, problems

FORM_TYPE = b"multipart/form-data"
FILE = "file"
MAX_FORM_BYTES = 64 * 1024
"""What the body may hold besides the file's bytes: boundaries, part headers, fields."""
FIELDS = frozenset(UploadForm.model_fields) - {FILE}
AFTER_THE_FILE = frozenset({"purpose"})
"""The fields that may follow the file part (the rest say how to read it, so come first)."""


def is_form(content_type: str | None) -> bool:
    return parse_options_header(content_type)[0] == FORM_TYPE


def unreadable(message: str) -> FileRefused:
    """A body that does not parse as multipart/form-data."""
    return FileRefused(400, "invalid_form", f"the body is not a readable form: {message}")


def unfit(message: str, param: str | None = None) -> FileRefused:
    """A form that parses but is not an upload's: another field, no file, ..."""
    return FileRefused(422, "invalid_form", message, param)


@dataclass(frozen=True)
class PartStart:
    name: str
    filename: str | None


PART_END = "part end"
FORM_END = "form end"
Event = PartStart | bytes | str
"""A part's start, a piece of its bytes, or PART_END / FORM_END."""


class Parts:
    """python-multipart's callbacks as events, gathered while a chunk is parsed; the bytes
    outside the file's part are counted against MAX_FORM_BYTES."""

    def __init__(self, boundary: bytes) -> None:
        callbacks: Any = {
            "on_part_begin": self.begin,
            "on_header_field": self.header_name,
            "on_header_value": self.header_value,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.data,
            "on_part_end": lambda: self.events.append(PART_END),
            "on_end": lambda: self.events.append(FORM_END),
        }
        try:
            self.parser = MultipartParser(boundary, callbacks)
        except FormParserError as error:
            raise unreadable(str(error)) from None
        self.events: list[Event] = []
        self.name, self.value, self.disposition = b"", b"", b""
        self.in_file, self.outside = False, 0

    def begin(self) -> None:
        self.disposition, self.in_file = b"", False

    def header_name(self, data: bytes, start: int, end: int) -> None:
        self.name += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self.value += data[start:end]

    def header_end(self) -> None:
        if self.name.lower() == b"content-disposition":
            self.disposition = self.value
        self.name, self.value = b"", b""

    def headers_finished(self) -> None:
        kind, options = parse_options_header(self.disposition)
        if kind != b"form-data" or b"name" not in options:
            raise unreadable("a part without `Content-Disposition: form-data; name=...`")
        name = decoded(options[b"name"], "name")
        filename = options.get(b"filename")
        self.in_file = name == FILE
        self.events.append(
            PartStart(name, None if filename is None else decoded(filename, "filename"))
        )

    def data(self, data: bytes, start: int, end: int) -> None:
        self.events.append(data[start:end])
        if self.in_file:
            self.outside -= end - start

    def write(self, chunk: bytes) -> list[Event]:
        """The events `chunk` completes (a malformed body: FileRefused)."""
        self.outside += len(chunk)
        try:
            self.parser.write(chunk)
        except FormParserError as error:
            raise unreadable(str(error)) from None
        if self.outside > MAX_FORM_BYTES:
            raise unfit(
                f"the form holds more than {MAX_FORM_BYTES} bytes besides the file's; "
                "send the file and its few fields only"
            )
        events, self.events = self.events, []
        return events


def decoded(value: bytes, what: str) -> str:
    """A part's `name` or `filename` (RFC 7578: UTF-8)."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise unfit(f"a part's {what} is not UTF-8", what) from None


async def form_events(boundary: bytes, body: AsyncIterator[bytes]) -> AsyncIterator[Event]:
    """The form's events, up to its closing boundary (a body cut short: FileRefused)."""
    parts = Parts(boundary)
    async for chunk in body:
        for event in parts.write(chunk):
            yield event
            if event == FORM_END:
                return
    raise unreadable("it ends before the form's closing boundary")


async def text_of(events: AsyncIterator[Event], name: str) -> str:
    """A text field's value (its bytes are few: MAX_FORM_BYTES bounds them)."""
    pieces: list[bytes] = []
    async for event in events:
        if event == PART_END:
            try:
                return b"".join(pieces).decode()
            except UnicodeDecodeError:
                raise unfit(f"the form field `{name}` is not UTF-8", name) from None
        assert isinstance(event, bytes)
        pieces.append(event)
    raise unreadable("it ends inside a field")


def unknown(name: str) -> FileRefused:
    known = ", ".join(f"`{known}`" for known in sorted(UploadForm.model_fields))
    return unfit(f"the form has a field `{name}`; it takes {known}", name)


def checked(fields: dict[str, str]) -> dict[str, str]:
    """The fields, held to what the form's schema says of them."""
    try:
        UploadForm.model_validate(fields | {FILE: b""})
    except ValidationError as invalid:
        found = problems(invalid.errors(), UploadForm)
        raise FileRefused(422, "invalid_request", one_line(found), found[0][0]) from None
    return fields


@dataclass
class Form:
    """A form read up to its file's bytes: the fields that came before them, the file
    part's name, and its bytes to come (`chunks`, which then read the rest of the form:
    a `purpose` after the file joins `fields`)."""

    fields: dict[str, str]
    filename: str | None
    events: AsyncIterator[Event] = field(repr=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        async for event in self.events:
            if event == PART_END:
                break
            assert isinstance(event, bytes)
            yield event
        async for event in self.events:
            if event == FORM_END:
                return
            assert isinstance(event, PartStart)
            if event.name == FILE:
                raise unfit("the form has two `file` parts; send one file an upload", FILE)
            if event.name in FIELDS - AFTER_THE_FILE:
                raise unfit(
                    f"the form field `{event.name}` comes after the file; send it before the "
                    "`file` part (or as a query parameter)",
                    event.name,
                )
            await self.take_field(event.name)

    async def take_field(self, name: str) -> None:
        """The field `name`'s value, whose part has begun, read and checked into `fields`."""
        if name not in FIELDS:
            raise unknown(name)
        if name in self.fields:
            raise unfit(f"the form field `{name}` is given twice; give it once", name)
        self.fields = checked(self.fields | {name: await text_of(self.events, name)})

    def upload(self, asked: Upload) -> Upload:
        """The upload the form and the query (`asked`, whose empty filename means none)
        describe together: the query's filename before the file part's, each other
        parameter from one of them."""
        filename = asked.filename or self.filename
        if not filename:
            raise FileRefused(
                422,
                "invalid_request",
                "the `file` part has no filename: give one (`filename=` in its "
                "Content-Disposition, or the `filename` query parameter)",
                "filename",
            )
        if len(filename) > MAX_FILENAME_CHARS:
            raise FileRefused(
                422,
                "invalid_request",
                f"the file name is longer than {MAX_FILENAME_CHARS} characters",
                "filename",
            )
        given = {
            "format": asked.format,
            "field": asked.field,
            "answer_field": asked.answer_field,
            "model": asked.model,
        }
        for name, value in given.items():
            if value is not None and name in self.fields:
                raise unfit(
                    f"`{name}` is both a form field and a query parameter; give it once", name
                )
        form_format = self.fields.get("format")
        return Upload(
            filename=filename,
            format=asked.format or (FileFormat(form_format) if form_format else None),
            field=asked.field or self.fields.get("field"),
            answer_field=asked.answer_field or self.fields.get("answer_field"),
            model=asked.model or self.fields.get("model"),
            idempotency_key=asked.idempotency_key,
        )

    def purpose(self) -> str:
        """The form's `purpose` (read once the file's bytes were: it may follow them)."""
        return self.fields.get("purpose", DEFAULT_PURPOSE)


async def read_form(content_type: str | None, body: AsyncIterator[bytes]) -> Form:
    """The form in `body` read up to its file's bytes (FileRefused when it is not one)."""
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        raise unreadable("its Content-Type names no boundary")
    form = Form({}, None, form_events(boundary, body))
    async for event in form.events:
        if event == FORM_END:
            break
        assert isinstance(event, PartStart)
        if event.name == FILE:
            form.filename = event.filename
            return form
        await form.take_field(event.name)
    raise unfit("the form has no `file` part: send the file as `file`", FILE)

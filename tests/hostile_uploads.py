"""Files that once took a reader down, and their kin: the upload fuzzer's corpus
(tests/e2e/test_upload_fuzz.py) and the bounds' tests use them. Each is small on disk."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from functools import cache

import pyarrow
import pyarrow.parquet

MIB = 1 << 20
LONG_VALUE_BYTES = 64 * MIB
BOMB_ROWS = 16


def deep_jsonl(levels: int = 100_000, opener: str = "[", closer: str = "]") -> bytes:
    """One row whose second field nests `levels` lists (~200 KB): Arrow's JSON parser
    recursed once a level and overflowed its stack."""
    return f'{{"question": "a", "x": {opener * levels}{closer * levels}}}\n'.encode()


def deep_objects_jsonl(levels: int = 100_000) -> bytes:
    return b'{"question": "a", "x": ' + b'{"a": ' * levels + b"1" + b"}" * levels + b"}\n"


def parquet_of(table: pyarrow.Table, **options: object) -> bytes:
    out = io.BytesIO()
    pyarrow.parquet.write_table(table, out, **options)
    return out.getvalue()


@cache
def dictionary_bomb(rows: int = BOMB_ROWS, value_bytes: int = LONG_VALUE_BYTES) -> bytes:
    """`rows` rows that all repeat one `value_bytes` string, zstd (a few KB): its metadata
    says it unpacks to one value's size; read, it is rows × that (a text column: the
    Arrow schema that would make it read back as a dictionary is not stored)."""
    value = pyarrow.array(["a" * value_bytes])
    column = pyarrow.DictionaryArray.from_arrays(pyarrow.array([0] * rows, pyarrow.int32()), value)
    table = pyarrow.table({"question": column})
    return parquet_of(table, compression="zstd", store_schema=False)


def plain_bomb(rows: int = 4, value_bytes: int = 32 * MIB) -> bytes:
    """Long values without a dictionary, one row group each (~10 KB): its metadata tells
    the truth, rows × `value_bytes`."""
    out = io.BytesIO()
    row = pyarrow.table({"question": pyarrow.array(["a" * value_bytes], pyarrow.large_string())})
    with pyarrow.parquet.ParquetWriter(
        out, row.schema, compression="zstd", use_dictionary=False
    ) as writer:
        for _ in range(rows):
            writer.write_table(row)
    return out.getvalue()


def not_utf8_parquet() -> bytes:
    text = pyarrow.array([b"\xff\xfe", b"ok"], pyarrow.binary()).view(pyarrow.string())
    return parquet_of(pyarrow.table({"question": text}))


def far_date_parquet() -> bytes:
    dates = pyarrow.array([2**31 - 1, 0], pyarrow.date32())
    return parquet_of(pyarrow.table({"question": ["a", "b"], "when": dates}))


def good_parquet(rows: int = 200) -> bytes:
    questions = [f"What is {i} + {i}?" for i in range(rows)]
    answers = [str(2 * i) for i in range(rows)]
    return parquet_of(pyarrow.table({"question": questions, "answer": answers}))


def good_jsonl(rows: int = 200) -> bytes:
    return "".join(
        json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
        for i in range(rows)
    ).encode()


def truncations(data: bytes, count: int, seed: int) -> list[bytes]:
    """`count` prefixes of `data`, cut at seeded places."""
    cuts = random.Random(seed).sample(range(1, len(data)), count)
    return [data[:cut] for cut in sorted(cuts)]


def mutations(data: bytes, count: int, seed: int, flips: int = 8) -> list[bytes]:
    """`count` copies of `data`, each with `flips` seeded bytes replaced."""
    rng, copies = random.Random(seed), []
    for _ in range(count):
        copy = bytearray(data)
        for at in rng.sample(range(len(copy)), flips):
            copy[at] = rng.randrange(256)
        copies.append(bytes(copy))
    return copies


def corpus() -> list[tuple[str, str, Callable[[], bytes]]]:
    """(case, filename, its bytes) for every hostile or odd upload the fuzzer sends."""
    jsonl, parquet = good_jsonl(), good_parquet()
    cases: list[tuple[str, str, Callable[[], bytes]]] = [
        ("deep lists", "deep.jsonl", deep_jsonl),
        ("deep objects", "deep.jsonl", deep_objects_jsonl),
        ("deep braces", "deep.jsonl", lambda: deep_jsonl(100_000, "{", "}")),
        ("brackets in a string", "s.jsonl", lambda: json.dumps({"question": "[" * 9999}).encode()),
        (
            "a line of 20 MiB",
            "long.jsonl",
            lambda: json.dumps({"question": "q" * 20 * MIB}).encode(),
        ),
        ("a CSV field of 20 MiB", "long.csv", lambda: b"question\n" + b"q" * 20 * MIB + b"\n"),
        ("dictionary bomb", "bomb.parquet", dictionary_bomb),
        ("plain bomb", "plain.parquet", plain_bomb),
        (
            "many columns",
            "wide.parquet",
            lambda: parquet_of(pyarrow.table({f"c{i}": ["x"] for i in range(5000)})),
        ),
        (
            "many CSV columns",
            "wide.csv",
            lambda: ",".join(f"c{i}" for i in range(20_000)).encode() + b"\n",
        ),
        ("empty", "empty.jsonl", lambda: b""),
        ("magic only", "magic.parquet", lambda: b"PAR1"),
        ("a parquet named jsonl", "p.jsonl", lambda: parquet),
        ("UTF-8 BOM", "bom.jsonl", lambda: b"\xef\xbb\xbf" + jsonl),
        ("UTF-16", "utf16.jsonl", lambda: jsonl.decode().encode("utf-16")),
        ("latin-1", "latin.csv", lambda: "question\ncaf\u00e9\n".encode("latin-1")),
        ("NUL bytes", "nul.jsonl", lambda: b'{"question": "a\x00b"}\n\x00\x00\n'),
        ("lone surrogate escape", "sur.jsonl", lambda: b'{"question": "\\ud800"}\n'),
        ("huge number", "num.jsonl", lambda: b'{"question": "a", "n": 1' + b"0" * 100_000 + b"}\n"),
        ("unterminated CSV quote", "q.csv", lambda: b'question\n"abc\n'),
        ("CRLF CSV", "crlf.csv", lambda: b"question,answer\r\nWhat?,1\r\n"),
        ("Parquet text not UTF-8", "utf.parquet", not_utf8_parquet),
        ("a date past 9999", "date.parquet", far_date_parquet),
        ("good JSONL", "good.jsonl", lambda: jsonl),
        ("good Parquet", "good.parquet", lambda: parquet),
    ]
    cases += [
        (f"truncated Parquet {i}", "cut.parquet", lambda cut=cut: cut)
        for i, cut in enumerate(truncations(parquet, 6, seed=1))
    ]
    cases += [
        (f"mutated Parquet {i}", "bits.parquet", lambda bits=bits: bits)
        for i, bits in enumerate(mutations(parquet, 10, seed=2))
    ]
    cases += [
        (f"mutated JSONL {i}", "bits.jsonl", lambda bits=bits: bits)
        for i, bits in enumerate(mutations(jsonl, 4, seed=3))
    ]
    return cases

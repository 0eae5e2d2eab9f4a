"""Hypothesis strategies for what a hostile client sends where the OpenAPI document cannot
lead schemathesis: sweep definitions and job specs that are valid but for one value, and
values JSON Schema does not describe (NaN and Infinity, which Python's JSON reads and
writes; integers past 64 bits; NUL, lone surrogates and path tricks in strings; deep
nesting), and YAML that uses anchors, aliases, tags and the YAML spellings of those numbers.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.jobs.limits import Limits
from app.sweeps.control import advance, claim_sweeps

FUZZED = settings(
    derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
"""What every fuzzing test runs under: the same examples each run (derived from the test,
not a random seed), none remembered, no deadline (requests reach real databases). The
same, that is, for the same modules loaded: Hypothesis also draws constants it finds in
the project's loaded modules (not the tests'), so a fuzzer run after other tests (which
loaded more of the project) can send other examples. A failure seen only then is a real
one all the same: its curl command reproduces it alone."""
SCALE = int(os.environ.get("OPD_FUZZ_SCALE", "1"))
"""How many times the suite's examples each fuzzer runs: the suite's few cover every route
and form in seconds; a long search raises it (`OPD_FUZZ_SCALE=20 pytest tests/app -k
fuzz`)."""


def examples(in_the_suite: int) -> int:
    """A fuzzer's `max_examples`: what the suite runs, times OPD_FUZZ_SCALE."""
    return in_the_suite * SCALE


METRIC = "opd/reverse_kl_mean"
CONTROLLER = "fuzz-controller"
BASE: dict[str, Any] = {
    "name": "fuzzed",
    "backend": "local",
    "student": {"base_model": "tiny-student", "lora_rank": 16},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {"source": "inline", "prompts": ["What is 1 + 1?", "What is 2 + 2?"]},
    "optim": {"learning_rate": 1e-3, "grad_clip_norm": 1.0},
    "loop": {"steps": 4, "batch_size": 2, "group_size": 2},
}
"""A complete job spec on the tiny presets: what every generated spec starts from."""

SPEC_PATHS = [
    "optim.learning_rate",
    "optim.grad_clip_norm",  # a float without an upper bound: Infinity passes its rule
    "optim.beta1",
    "sampling.temperature",
    "sampling.max_tokens",
    "loop.steps",
    "loop.loss_fn",
    "loop.kl_penalty_coef",
    "loop.save_every",
    "student.lora_rank",
    "student.seed",
    "student.base_model",
    "teacher.base_model",
    "student.init_from.job",
    "student.init_from.checkpoint",
    "student.init_from.path",
    "teacher.init_from.path",
    "dataset.source",
    "dataset.path",
    "dataset.prompts",
    "metadata.note",
    "priority",
    "name",
]
"""Paths of a job spec with every kind of value (floats, integers, enums, model names,
weights paths, lists), where a sweep parameter or a spec's one odd value goes."""

NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 0.5, 1e-3, 3.0]
INTEGERS = [0, -1, 1, 4, 2**31, 2**63, 2**64, -(2**63) - 1, 10**40]
TEXTS = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",  # a lone surrogate: JSON escapes it, UTF-8 cannot encode it
    "../outside",
    "/etc",
    "app/../tests",
    "tiny-teachr",
    "Qwen/Qwen3.5-4B",
    "x" * 5_000,
    "é" * 300,
]

floats = st.sampled_from(NUMBERS) | st.floats()
integers = st.sampled_from(INTEGERS) | st.integers()
texts = st.sampled_from(TEXTS) | st.text(max_size=40)
form_texts = texts.filter(lambda text: "\ud800" not in text)
"""Texts a form can carry: UTF-8 has no lone surrogates."""
scalars = st.booleans() | integers | floats | texts
"""What a sweep's `values` may hold (bool, int, float, str), at their edges."""


def nested(depth: int, leaf: Any = 1) -> Any:
    """`leaf` inside `depth` lists, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


anything = st.recursive(
    st.none() | scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
) | st.integers(50, 400).map(nested)
"""Any JSON value, NaN and Infinity included, some of them nested hundreds deep."""


def with_value(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `spec` with `value` at a dotted path (the groups on the way made)."""
    changed = copy.deepcopy(spec)
    node = changed
    *groups, last = path.split(".")
    for group in groups:
        if not isinstance(node.get(group), dict):
            node[group] = {}
        node = node[group]
    node[last] = value
    return changed


paths = st.integers(0, 4).flatmap(
    lambda pick: st.text(max_size=30) if pick == 0 else st.sampled_from(SPEC_PATHS)
)
"""Usually a path of the spec, else any text."""


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """The base spec, or it with one odd value at a path (usually a real one)."""
    if draw(st.booleans()):
        return copy.deepcopy(BASE)
    value = draw(st.sampled_from([anything, scalars, floats]).flatmap(lambda kind: kind))
    return with_value(BASE, draw(paths), value)


def parameter_values() -> st.SearchStrategy[dict[str, Any]]:
    listed = st.lists(scalars, min_size=1, max_size=5) | st.lists(anything, max_size=3)
    ranged = st.fixed_dictionaries(
        {"min": floats | integers, "max": floats | integers},
        optional={"distribution": st.sampled_from(["uniform", "log_uniform", "int_uniform", "x"])},
    )
    return (
        st.builds(lambda values: {"values": values}, listed)
        | ranged
        | st.dictionaries(texts, anything, max_size=3)
    )


early_stops = st.fixed_dictionaries(
    {"type": st.sampled_from(["asha", "median", "hyperband"]), "min_steps": integers},
    optional={"eta": integers},
)

SWEEP: dict[str, Any] = {
    "name": "fuzzed-sweep",
    "parameters": {
        "optim.learning_rate": {"min": 1e-4, "max": 1e-2, "distribution": "log_uniform"},
        "loop.loss_fn": {"values": ["importance_sampling", "ppo"]},
    },
    "method": "random",
    "metric": {"name": METRIC, "goal": "minimize"},
    "max_trials": 4,
    "parallel": 2,
    "early_stop": {"type": "asha", "min_steps": 1, "eta": 2},
}
"""A valid sweep (with `base` or `base_job` added): what every generated one starts from."""


JOBS = ("own-job", "another-teams-job")
"""What `base_job` names, for the test to replace by the ids of such jobs."""
NAMED_JOB = re.compile(r'"?\b(own-job|another-teams-job)\b"?')


def with_job_ids(text: str, job_ids: dict[str, int]) -> str:
    """JSON or YAML `text` with the jobs JOBS names replaced by their ids."""
    return NAMED_JOB.sub(lambda name: str(job_ids[name[1]]), text)


def sweep_twists() -> st.SearchStrategy[dict[str, Any]]:
    """One thing changed in a sweep definition: a parameter at any path with odd values or
    bounds, an odd value in its base, `base_job` naming another team's job or none, an odd
    method, count, seed, early-stopping rule, name or extra field."""
    parameter = st.builds(lambda path, values: {path: values}, paths, parameter_values())
    return st.one_of(
        st.builds(lambda extra: {"parameters": SWEEP["parameters"] | extra}, parameter),
        st.builds(lambda only: {"parameters": only}, parameter),
        st.builds(lambda spec: {"base": spec}, specs()),
        st.builds(lambda job: {"base_job": job}, st.sampled_from(JOBS) | integers),
        st.builds(lambda method: {"method": method}, st.sampled_from(["grid", "tpe", "bayes"])),
        st.builds(lambda count: {"max_trials": count}, integers),
        st.builds(lambda count: {"parallel": count}, integers),
        st.builds(lambda seed: {"seed": seed}, integers),
        st.builds(lambda rule: {"early_stop": rule}, st.none() | early_stops | anything),
        st.builds(lambda goal: {"metric": {"name": METRIC, "goal": goal}}, anything),
        st.builds(lambda name: {"name": name}, texts),
        st.builds(lambda extra: {"extra": extra}, anything),
    )


@st.composite
def sweep_definitions(draw: st.DrawFn) -> dict[str, Any]:
    """A valid sweep over the base spec or the team's job, with one to three twists: so
    usually one that is wrong in one place only, where the deep checks are."""
    base = {"base": BASE} if draw(st.booleans()) else {"base_job": JOBS[0]}
    definition = copy.deepcopy(SWEEP | base)
    for twist in draw(st.lists(sweep_twists(), min_size=1, max_size=3)):
        if "base" in twist or "base_job" in twist:
            definition.pop("base", None)
            definition.pop("base_job", None)
        definition |= twist
    return definition


def as_json(document: Any) -> str:
    """JSON as Python writes it: NaN and Infinity as bare words, which Python's (and so the
    API's) parser reads back as floats."""
    return json.dumps(document, allow_nan=True)


def raw_json(document: dict[str, Any], key: str = "grad_clip_norm") -> list[str]:
    """`document`'s JSON as no encoder writes it: `key`'s number spelled too large for a
    float (which reads as Infinity), with 4,000 digits (Python reads up to 4,300), or as
    NaN; a key given twice; the document 100,000 levels deep."""
    text = as_json(document)
    number = re.search(rf'(?<="{key}": )[\d.e-]+', text)
    assert number, text
    spliced = [
        text[: number.start()] + odd + text[number.end() :]
        for odd in ("1e999", "-1e999", "NaN", "9" * 4_000)
    ]
    depth = 100_000
    return [*spliced, text[:-1] + ', "name": "again"}', "[" * depth + text + "]" * depth]


def prompt_flood(definition: dict[str, Any], copies: int, prompt_chars: int) -> str:
    """A sweep over BASE as YAML whose inline prompts are one long prompt and `copies`
    aliases of it: a few bytes each that expand to `prompt_chars` each (how 58 KB of
    YAML once became a 100 MB stored definition)."""
    text = yaml.safe_dump(definition | {"base": with_value(BASE, "dataset.prompts", ["PROMPTS"])})
    flood = f"[&prompt {'x' * prompt_chars}{', *prompt' * copies}]"
    return text.replace("- PROMPTS", "").replace("prompts:", f"prompts: {flood}")


ALIASED_FLOODS = [
    "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n",
    "&a [*a]\n",  # an alias of the node that holds it
]
ODD_YAML = [
    "!!python/object/apply:os.system ['true']\n",
    "%YAML 9.9\n---\nname: x\n",
    "name: !!binary aGVsbG8=\n",
    "? [a, b]\n: c\n",  # a key that is not a string
    "[" * 5_000 + "]" * 5_000,
    "a:\n" + "".join("  " * depth + "a:\n" for depth in range(1, 400)),
    "name: x\nname: y\n",
    "--- 1\n--- 2\n",
    "\t\x00\x85",
]


def spec_aliased(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec whose eval prompts are its dataset, the same object: YAML writes it once
    with an anchor and once as an alias."""
    return spec | {"eval": {"every": 2, "dataset": spec.get("dataset")}}


def sweep_aliased(definition: dict[str, Any]) -> dict[str, Any]:
    """A sweep whose parameters share one range or list of values, written once."""
    shared = next(iter(definition["parameters"].values()))
    return definition | {
        "parameters": dict.fromkeys(["optim.learning_rate", *definition["parameters"]], shared)
    }


def yaml_texts(
    documents: st.SearchStrategy[dict[str, Any]],
    aliased: Callable[[dict[str, Any]], dict[str, Any]],
) -> st.SearchStrategy[str]:
    """YAML as a person or an attacker writes it: a document dumped plainly (NaN and
    Infinity as .nan and .inf), or `aliased` (the same subtree twice, so with an anchor
    and an alias); a flood of aliases, odd directives, tags and nesting; any text."""
    dumped = documents.map(lambda data: yaml.safe_dump(data, allow_unicode=True))
    return (
        dumped
        | documents.map(lambda data: yaml.safe_dump(aliased(data), allow_unicode=True))
        | st.sampled_from(ALIASED_FLOODS + ODD_YAML)
        | st.text(max_size=200)
        | dumped.map(lambda text: text.replace("0.001", ".inf").replace("4", "1e400"))
    )


async def control_once(
    sessions: async_sessionmaker[AsyncSession], settings: Settings, sweep_id: int
) -> None:
    """One pass of a worker's sweep controller over a stored sweep: it creates the first
    trials (jobs) from the stored definition, so what was stored must make valid ones."""
    async with sessions() as session:
        assert sweep_id in await claim_sweeps(session, CONTROLLER, 60)
        await advance(session, sweep_id, CONTROLLER, Limits.of(settings), settings)


def has_alias(text: str) -> bool:
    """Whether YAML `text` uses an alias (False for text that is no YAML). Read with
    libyaml: PyYAML's own parser takes 8 s over 5,000-deep nesting, which the forms refuse
    after 64 levels."""
    try:
        events = yaml.parse(text, Loader=yaml.CSafeLoader)
        return any(isinstance(event, yaml.AliasEvent) for event in events)
    except yaml.YAMLError:
        return False

"""The dashboard's forms fuzzed (hypothesis, on Postgres): the new-job form and the sweep
form take any YAML (anchors and aliases, .nan and .inf, 1e400, tags, directives, deep
nesting, any text) and any other fields (a missing or wrong CSRF token, an odd
idempotency key, extra fields, too many), and answer a page or a redirect, never a 5xx.
YAML with an alias is refused by both forms (an alias may stand for a huge tree); a sweep
the form stores can be run by the controller and shown. `OPD_FUZZ_SCALE=20` runs 20 times
the suite's 50 examples.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.keys import NewKey
from app.core.config import Settings
from tests.app.fuzzing import (
    BASE,
    FUZZED,
    JOBS,
    SWEEP,
    control_once,
    examples,
    form_texts,
    has_alias,
    prompt_flood,
    spec_aliased,
    specs,
    sweep_aliased,
    sweep_definitions,
    with_job_ids,
    yaml_texts,
)
from tests.app.web.conftest import SignIn, csrf_of

FORM_EXAMPLES = examples(50)
CSRF = "csrf_token"
OTHER_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        CSRF: st.sampled_from(["", "forged", "a" * 5_000]),  # replaces the page's token
        "idempotency_key": form_texts,
        "base_job": form_texts,
    },
) | st.dictionaries(form_texts, form_texts, min_size=45, max_size=60)
"""Fields beside the YAML: a wrong token, odd values, extra fields, more than the 50 a
form may have."""
BASE_YAML = yaml.safe_dump(BASE)
SWEEP_YAML = yaml.safe_dump(SWEEP | {"base_job": JOBS[0]})
DEEP_YAML = "name: [" + "[" * 5_000 + "]" * 5_000 + "]\n"


@pytest.fixture
async def csrf(client: httpx.AsyncClient, key: NewKey, sign_in: SignIn) -> str:
    """`key` signed in; the token its forms carry."""
    await sign_in(key)
    return csrf_of(await client.get("/ui/new"))


async def submitted(
    client: httpx.AsyncClient, path: str, fields: dict[str, str], text_field: str, text: str
) -> httpx.Response:
    """POST the form: below 500 whatever was sent; a redirect only for YAML without
    aliases."""
    response = await client.post(path, data=fields | {text_field: text})
    assert response.status_code < 500, f"{response.status_code} for {fields} and:\n{text[:2000]}"
    if has_alias(text):
        assert response.status_code != 303, f"{path} stored YAML with aliases:\n{text[:2000]}"
    return response


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@given(
    spec=yaml_texts(specs(), spec_aliased),
    definition=yaml_texts(sweep_definitions(), sweep_aliased),
    fields=OTHER_FIELDS,
)
@example(  # issue 25, item 4: Infinity in a spec
    spec=BASE_YAML.replace("grad_clip_norm: 1.0", "grad_clip_norm: .inf"),
    definition=SWEEP_YAML,
    fields={},
)
@example(  # item 7: 18 KB of YAML that the sweep form would store as 2 MB
    spec=BASE_YAML,
    definition=prompt_flood(SWEEP, copies=2_000, prompt_chars=1_000),
    fields={},
)
@example(  # item 7: aliases in a valid sweep definition
    spec=yaml.safe_dump(spec_aliased(BASE)),
    definition=yaml.safe_dump(sweep_aliased(SWEEP | {"base_job": JOBS[0]})),
    fields={},
)
@example(spec=BASE_YAML, definition=SWEEP_YAML, fields={"idempotency_key": "\x00"})
@example(spec=DEEP_YAML, definition=DEEP_YAML, fields={})
@settings(FUZZED, max_examples=FORM_EXAMPLES)
async def test_the_forms_take_any_yaml_and_fields_and_never_answer_a_server_error(
    spec: str,
    definition: str,
    fields: dict[str, Any],
    client: httpx.AsyncClient,
    csrf: str,
    job_ids: dict[str, int],
    sessions: async_sessionmaker[AsyncSession],
    settings: Settings,
) -> None:
    fields = {CSRF: csrf} | fields
    created = await submitted(client, "/ui/new", fields, "spec", spec)
    if created.status_code == 303:
        assert (await client.get(created.headers["location"])).status_code == 200

    definition = with_job_ids(definition, job_ids)
    started = await submitted(client, "/ui/sweeps/new", fields, "definition", definition)
    if started.status_code != 303:
        return
    sweep_id = int(started.headers["location"].rsplit("/", 1)[1])
    await control_once(sessions, settings, sweep_id)
    for page in (started.headers["location"], "/ui/sweeps", "/ui/jobs"):
        assert (await client.get(page)).status_code == 200, page

"""Weights paths are the team's own: `teacher.init_from` names a job of the team and the
service fills in its sampler weights; a raw `teacher.model_path` may not name what the
service saved for another team, and on the local backend must lie under the data root
(as must a `base_model` folder). Each refusal is a 422 naming the field, worded the same
whatever lies at the path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.jobs.store import claim_job, complete_job
from app.records.store import record_checkpoint
from tests.app.conftest import auth, small_spec

REMOTE = "trio://fake/run-7/weights"


@pytest.fixture
def trained(session, submit):
    """A succeeded job of `as_key`'s team (default: the caller's) that saved sampler
    weights after step 2 and final ones under `root`."""

    async def make(root: str = REMOTE, as_key=None, **spec: Any) -> dict[str, Any]:
        job = await submit(as_key, loop={"steps": 4}, **spec)
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 2, "sampler", f"{root}/step-2")
        await record_checkpoint(session, job["id"], "w", 4, "state", f"{root}/state-4")
        await record_checkpoint(session, job["id"], "w", 4, "final", f"{root}/final")
        await complete_job(session, job["id"], "w", f"{root}/final")
        return job

    return make


def teacher(**fields: Any) -> dict[str, Any]:
    return small_spec(backend="trio", teacher={"base_model": "Qwen/Qwen3.5-4B", **fields})


async def post(client, key, spec: dict[str, Any]):
    return await client.post("/v1/jobs", json=spec, headers=auth(key))


async def refusal(client, key, spec: dict[str, Any], param: str) -> str:
    response = await post(client, key, spec)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: "), error
    return error["message"]


@pytest.mark.parametrize(("checkpoint", "path"), [("final", "/final"), (2, "/step-2")])
async def test_a_teacher_trained_here_is_named_by_job_and_checkpoint(
    client, key, trained, checkpoint, path
):
    source = await trained(backend="trio")
    spec = teacher(init_from={"job": source["id"], "checkpoint": checkpoint})
    response = await post(client, key, spec)
    assert response.status_code == 201, response.text
    init_from = response.json()["spec"]["teacher"]["init_from"]
    assert init_from == {"job": source["id"], "checkpoint": checkpoint, "path": REMOTE + path}

    cloned = await client.post(
        f"/v1/jobs/{response.json()['id']}/clone", json={"name": "again"}, headers=auth(key)
    )
    assert cloned.status_code == 201, "the clone's path is filled again, not refused"
    assert cloned.json()["spec"]["teacher"]["init_from"]["path"] == REMOTE + path


async def test_another_teams_job_is_as_unknown_as_a_job_that_does_not_exist(
    client, key, make_key, trained
):
    theirs = await trained(backend="trio", as_key=await make_key())
    param = "teacher.init_from.job"
    refused = await refusal(client, key, teacher(init_from={"job": theirs["id"]}), param)
    missing = await refusal(client, key, teacher(init_from={"job": 2**31 - 1}), param)
    assert refused.replace(str(theirs["id"]), "N") == missing.replace(str(2**31 - 1), "N")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"init_from": {"job": 0, "path": "/etc"}}, "teacher.init_from.job", "greater than"),
        ({"path": "/elsewhere"}, "teacher.init_from.path", "filled by the service"),
        ({"checkpoint": 3}, "teacher.init_from.checkpoint", "sampler weights saved after step 3"),
        ({"base_model": "other/model"}, "teacher.base_model", "needs the same"),
        ({"model_path": REMOTE + "/final"}, "teacher.init_from", "not both"),
    ],
)
async def test_a_teacher_init_from_that_does_not_fit_is_refused(
    client, key, trained, fields, param, words
):
    source = await trained(backend="trio")
    init = {"job": source["id"]}
    body: dict[str, Any] = {"init_from": init}
    for name, value in fields.items():
        (init if name in ("path", "checkpoint") else body)[name] = value
    assert words in await refusal(client, key, teacher(**body), param)


async def test_a_model_path_of_another_teams_weights_is_refused(client, key, make_key, trained):
    await trained(backend="trio", as_key=await make_key())
    ours = await trained(root="trio://fake/run-8/weights", backend="trio")
    theirs = [
        REMOTE + "/final",
        REMOTE + "/step-2/adapter",
        REMOTE + "//final/",
        "trio://fake/run-7/weights/x/../final",
    ]
    messages = {
        await refusal(client, key, teacher(model_path=path), "teacher.model_path")
        for path in theirs
    }
    assert len(messages) == 1, "one answer, whatever the path"
    for allowed in ("trio://fake/run-8/weights/final", "trio://fake/run-9/weights/final"):
        response = await post(client, key, teacher(model_path=allowed))
        assert response.status_code == 201, (allowed, response.text)
    assert ours["team_id"] == key.team.id


@pytest.fixture
def roots(settings) -> tuple[Path, Path]:
    """A data root with a teacher folder in it, and an artifact root inside the data root
    (so that only the artifact rule keeps saved weights out)."""
    (settings.data_root / "teachers" / "math").mkdir(parents=True)
    return settings.data_root, settings.artifact_root


@pytest.fixture
def settings(settings):
    home = settings.home
    return settings.model_copy(
        update={"data_root": home / "data", "artifact_root": home / "data" / "artifacts"}
    )


def local(**teacher_fields: Any) -> dict[str, Any]:
    return small_spec(teacher={"base_model": "tiny-teacher", **teacher_fields})


async def test_a_local_model_path_must_lie_under_the_data_root(client, key, roots, tmp_path):
    data_root, artifact_root = roots
    (artifact_root / "job-1" / "sampler" / "final").mkdir(parents=True)
    (tmp_path / "private").mkdir()
    (data_root / "escape").symlink_to(tmp_path / "private", target_is_directory=True)
    refused = [
        "../private",
        str(tmp_path / "private"),
        str(tmp_path / "no-such-folder"),
        "escape",
        "escape/../escape",
        "teachers/../../private",
        "artifacts/job-1/sampler/final",
        str(artifact_root / "job-1"),
    ]
    messages = {
        await refusal(client, key, local(model_path=path), "teacher.model_path") for path in refused
    }
    assert len(messages) == 1, "the same answer whether the folder exists or not"
    assert str(tmp_path) not in messages.pop()
    for allowed in ("teachers/math", str(data_root / "teachers" / "math"), "teachers/new"):
        response = await post(client, key, local(model_path=allowed))
        assert response.status_code == 201, (allowed, response.text)
        assert response.json()["spec"]["teacher"]["model_path"] == allowed, "stored as given"


@pytest.mark.parametrize("group", ["student", "teacher"])
async def test_a_local_base_model_folder_must_lie_under_the_data_root(
    client, key, roots, group, tmp_path
):
    data_root, _ = roots
    for model in ("/etc", str(tmp_path), "../models/x", "./models/x", "~/models"):
        spec = small_spec(**{group: {"base_model": model}})
        await refusal(client, key, spec, f"{group}.base_model")
    for model in (str(data_root / "teachers" / "math"), "tiny-student", "Qwen/Qwen3-0.6B"):
        response = await post(client, key, small_spec(**{group: {"base_model": model}}))
        assert response.status_code == 201, (model, response.text)


async def test_an_operators_gguf_file_is_confined_like_a_model_folder(client, key, roots, tmp_path):
    data_root, _ = roots
    outside = tmp_path / "outside.Q4_1.gguf"
    outside.write_bytes(b"GGUF")
    (data_root / "models").mkdir(exist_ok=True)
    (data_root / "models" / "link.gguf").symlink_to(outside)
    for model in (str(outside), str(data_root / "models" / "link.gguf"), "../models/m.gguf"):
        message = await refusal(
            client, key, small_spec(student={"base_model": model}), "student.base_model"
        )
        assert "model folder or GGUF file must be an absolute path under" in message
    inside = small_spec(student={"base_model": str(data_root / "models" / "smollm2.Q4_1.gguf")})
    response = await post(client, key, inside)
    assert response.status_code == 201, response.text


async def test_an_eval_dataset_file_is_confined_like_the_training_one(client, key, roots):
    spec = small_spec(eval={"dataset": {"source": "file", "path": "../secret.jsonl"}})
    message = await refusal(client, key, spec, "eval.dataset.path")
    assert "outside the server's data root" in message


def two_teachers(mul: dict[str, Any]) -> dict[str, Any]:
    """A routed two-teacher trio spec whose `mul` teacher is `mul`."""
    spec = small_spec(
        backend="trio",
        teachers={"add": {"base_model": "Qwen/Qwen3.5-4B"}, "mul": mul},
        datasets=[
            {"name": "add", "source": "arithmetic", "ops": ["add"], "teacher": "add"},
            {"name": "mul", "source": "arithmetic", "ops": ["mul"], "teacher": "mul"},
        ],
    )
    del spec["dataset"]
    return spec


async def test_every_teacher_under_teachers_follows_the_same_rules(client, key, make_key, trained):
    await trained(backend="trio", as_key=await make_key())
    refused = two_teachers({"base_model": "Qwen/Qwen3.5-4B", "model_path": REMOTE + "/final"})
    await refusal(client, key, refused, "teachers.mul.model_path")

    ours = await trained(root="trio://fake/run-8/weights", backend="trio")
    named = two_teachers({"base_model": "Qwen/Qwen3.5-4B", "init_from": {"job": ours["id"]}})
    response = await post(client, key, named)
    assert response.status_code == 201, response.text
    init_from = response.json()["spec"]["teachers"]["mul"]["init_from"]
    assert init_from["path"] == "trio://fake/run-8/weights/final"
    filled = two_teachers(
        {"base_model": "Qwen/Qwen3.5-4B", "init_from": {"job": ours["id"], "path": "/etc"}}
    )
    await refusal(client, key, filled, "teachers.mul.init_from.path")


@pytest.mark.parametrize("group", ["student", "teacher"])
async def test_a_relative_base_model_that_names_a_folder_is_a_path(client, key, roots, group):
    """A hub id is `name` or `org/name`: anything else is a folder, and a folder must be
    absolute, under the data root, so each of these is refused alike."""
    refused = [
        "app/../etc",
        "weights/../weights/qwen",
        "weights\\qwen",
        "org/name/extra",
        ".hidden",
    ]
    param = f"{group}.base_model"
    messages = {
        await refusal(client, key, small_spec(**{group: {"base_model": model}}), param)
        for model in refused
    }
    assert len(messages) == 1, messages
    for model in ("Qwen/Qwen3-0.6B", "org/not-here", "tiny-student"):
        response = await post(client, key, small_spec(**{group: {"base_model": model}}))
        assert response.status_code == 201, (model, response.text)


@pytest.mark.parametrize("group", ["student", "teacher"])
async def test_a_name_gets_one_answer_whatever_folders_the_apis_directory_holds(
    client, key, roots, group, tmp_path, monkeypatch
):
    """A name gets the answer its shape gives, whether or not a folder of that name lies in
    the API's working directory: were it a folder there, the answer would say it exists.
    `org/name` is a hub id (stored); a bare name that is no preset is refused, alike."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "weights" / "qwen").mkdir(parents=True)
    for here, missing, status in (
        ("tests", "no-such-xyz", 422),
        ("weights/qwen", "weights/no-such-xyz", 201),
    ):
        answers = [
            await post(client, key, small_spec(**{group: {"base_model": model}}))
            for model in (here, missing)
        ]
        assert [answer.status_code for answer in answers] == [status, status], answers[0].text
        if status == 422:
            error, other = (answer.json()["error"] for answer in answers)
            assert error["message"] == other["message"].replace(missing, here)
            continue
        spec, other = (answer.json()["spec"] for answer in answers)
        assert spec == other | {group: other[group] | {"base_model": here}}


async def test_a_system_folder_and_a_missing_one_are_refused_alike(client, key, roots, trained):
    """Whatever road names it (init_from.path, a base_model absolute or relative, a local
    model_path, a sweep's value), /etc and a folder that does not exist get one answer."""
    source = await trained(backend="trio")
    up = "x/" + "../" * 12

    def specs(folder: str) -> list[dict[str, Any]]:
        return [
            teacher(init_from={"job": source["id"], "path": folder}),
            small_spec(student={"init_from": {"job": source["id"], "path": folder}}),
            small_spec(student={"base_model": folder}),
            small_spec(teacher={"base_model": up + folder.lstrip("/")}),
            local(model_path=folder),
        ]

    answers = {}
    for folder in ("/etc", "/nonexistent-xyz"):
        answers[folder] = [(await post(client, key, spec)).json() for spec in specs(folder)]
        sweep = {
            "name": "where",
            "base": small_spec(),
            "parameters": {"student.base_model": {"values": [folder]}},
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        }
        answer = await client.post("/v1/sweeps", json=sweep, headers=auth(key))
        answers[folder].append(answer.json())
    assert all(answer["error"]["code"] == "invalid_request" for answer in answers["/etc"])
    named_alike = str(answers["/nonexistent-xyz"]).replace("nonexistent-xyz", "etc")
    assert str(answers["/etc"]) == named_alike

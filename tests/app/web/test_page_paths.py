"""The dashboard shows a team's session no worker folder (issue 36): a job page's events,
spec and final weights, and the compare page's spec differences; an admin's session sees
them as recorded."""

from __future__ import annotations

from tests.app.api.routes.test_server_paths import continuing, saved_job


async def test_the_dashboard_shows_a_team_no_folder(
    client, key, make_key, submit, session, settings, box, sign_in
):
    job, folder = await saved_job(session, submit, settings, box)
    continued = await submit(teacher=continuing(job))
    pages = [
        f"/ui/jobs/{job['id']}",
        f"/ui/jobs/{continued['id']}",
        f"/ui/compare?jobs={job['id']}&jobs={continued['id']}",
    ]

    await sign_in(key)
    team = [await client.get(page) for page in pages]
    await sign_in(await make_key(admin=True))
    admin = await client.get(pages[0])

    for page, answer in zip(pages, team, strict=True):
        assert answer.status_code == 200 and str(settings.artifact_root) not in answer.text, page
    assert f"Saved weights: job-{job['id']}/final" in team[0].text
    assert folder in admin.text

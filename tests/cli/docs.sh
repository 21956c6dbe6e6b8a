#!/usr/bin/env bash
# The tables in docs/knobs.md are exactly what `feplb knobs --markdown` and
# `feplb knobs --gpus --markdown` print.
set -euo pipefail
feplb=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
expected=$("$feplb" knobs --markdown; "$feplb" knobs --gpus --markdown)
actual=$(grep '^|' "$repo/docs/knobs.md")
if [[ "$expected" != "$actual" ]]; then
  echo "docs/knobs.md is out of date; regenerate its tables with: feplb knobs --markdown; feplb knobs --gpus --markdown" >&2
  diff <(echo "$expected") <(echo "$actual") >&2 || true
  exit 1
fi

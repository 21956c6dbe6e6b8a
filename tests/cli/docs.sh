#!/usr/bin/env bash
# The knob table in docs/knobs.md is exactly what `feplb knobs --markdown` prints.
set -euo pipefail
feplb=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
expected=$("$feplb" knobs --markdown)
actual=$(grep '^|' "$repo/docs/knobs.md")
if [[ "$expected" != "$actual" ]]; then
  echo "docs/knobs.md is out of date; regenerate its table with: feplb knobs --markdown" >&2
  diff <(echo "$expected") <(echo "$actual") >&2 || true
  exit 1
fi

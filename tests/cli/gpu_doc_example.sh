#!/usr/bin/env bash
# The lifecycle example in docs/gpu.md is exactly the code between the [lifecycle] lines of
# tests/consumer/lifecycle.cc, which the install test compiles against the installed package.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source_part=$(sed -n '/\/\/ \[lifecycle\]/,/\/\/ \[lifecycle\]/p' "$repo/tests/consumer/lifecycle.cc" |
  sed '1d;$d' | sed 's/^    //')
doc_part=$(sed -n '/^```cpp lifecycle$/,/^```$/p' "$repo/docs/gpu.md" | sed '1d;$d')
if [[ -z $source_part || "$source_part" != "$doc_part" ]]; then
  echo "docs/gpu.md's lifecycle example differs from tests/consumer/lifecycle.cc (copy the part between its [lifecycle] lines, unindented by 4)" >&2
  diff <(echo "$source_part") <(echo "$doc_part") >&2 || true
  exit 1
fi

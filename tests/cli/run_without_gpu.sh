#!/usr/bin/env bash
# `feplb run` on a machine without a GPU (or a build without CUDA): one clear line, exit 2.
# Where a GPU is present this test has nothing to check (the GPU path is tests/gpu's job).
set -uo pipefail
feplb=$1
if "$feplb" devices >/dev/null 2>&1; then
  echo "a GPU is present: skipping the no-GPU check"
  exit 0
fi
err=$("$feplb" run 2>&1 >/dev/null)
rc=$?
if [[ $rc -ne 2 ]]; then echo "feplb run: exit $rc, expected 2" >&2; exit 1; fi
if [[ $(printf '%s\n' "$err" | wc -l) -ne 1 ]]; then echo "feplb run: more than one line: $err" >&2; exit 1; fi
if ! grep -qE "^feplb: error: .*(no GPU available|built without CUDA)" <<<"$err"; then
  echo "feplb run: unexpected message: $err" >&2
  exit 1
fi

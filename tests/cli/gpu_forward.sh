#!/usr/bin/env bash
# `feplb run` and `feplb devices` exec feplb-gpu from the directory of the running feplb, with the
# same arguments and exit status; without it (a CPU build) they say so in one line, exit 2.
set -uo pipefail
bin=$(realpath "$1")
# The copies below keep finding feplb's shared libraries (their RPATH is $ORIGIN/../lib).
export LD_LIBRARY_PATH="$(dirname "$bin")/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch/alone" "$scratch/paired"
cd "$scratch" || exit 1
fail() {
  echo "gpu_forward: $1" >&2
  exit 1
}

cp "$bin" alone/feplb
for cmd in run devices; do
  err=$(alone/feplb "$cmd" --steps 1 2>&1 >/dev/null)
  rc=$?
  [[ $rc -eq 2 ]] || fail "$cmd without feplb-gpu: exit $rc, expected 2"
  [[ $(printf '%s\n' "$err" | wc -l) -eq 1 ]] || fail "$cmd: more than one line: $err"
  grep -q "feplb-gpu" <<<"$err" || fail "$cmd: the message does not name feplb-gpu: $err"
done

# A stand-in feplb-gpu that shows what it was given.
cp "$bin" paired/feplb
cat >paired/feplb-gpu <<'SH'
#!/bin/sh
echo "argv: $*"
exit 7
SH
chmod +x paired/feplb-gpu
out=$(paired/feplb run --steps 3 --trace "a b.json")
rc=$?
[[ $rc -eq 7 ]] || fail "the exit status of feplb-gpu was not passed on ($rc)"
[[ $out == "argv: run --steps 3 --trace a b.json" ]] || fail "feplb-gpu got: $out"
out=$(paired/feplb devices)
[[ $out == "argv: devices" ]] || fail "feplb-gpu got: $out"
# Other commands never start it.
paired/feplb knobs >/dev/null || fail "feplb knobs failed beside a feplb-gpu"
echo "gpu_forward: passed"

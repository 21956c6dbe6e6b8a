#!/bin/bash
# A/B of two builds of feplb (BEFORE and AFTER: build directories, Release, with
# feplb_cpu_bench built): instructions per 96 default plans under callgrind (deterministic), then
# the planner benchmark's default cases, the two builds in turn three times on one pinned core.
# Needs valgrind (apt-get install valgrind). Usage: run.sh BEFORE AFTER [OUT_DIR]
set -eu
before=$1 after=$2 out=${3:-/tmp/planner-ab}
here=$(cd "$(dirname "$0")" && pwd) repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
g++ -O3 -DNDEBUG -std=c++20 -I"$repo" -DFEPLB_DATA_DIR="\"$repo/data\"" "$here/callgrind_driver.cc" \
  -o "$out/driver" -L"$after/lib" -lfeplb_core -lfeplb_sim
for w in "72 288 5 72" "256 1024 5 256" "64 128 0 64 olmoe" "8 128 5 8"; do
  for b in "$before" "$after"; do
    n=$(LD_LIBRARY_PATH="$b/lib" valgrind --tool=callgrind --instr-atstart=no \
          --callgrind-out-file="$out/callgrind.out" "$out/driver" $w 2>&1 | awk '/refs/ {print $NF}')
    echo "instructions  $w  $b  $n"
  done
done
for r in 1 2 3; do
  for b in "$before" "$after"; do
    tag=$(basename "$b")-$r
    taskset -c 1 "$b/bin/feplb_cpu_bench" --benchmark_filter='plan/feplb/' \
      --benchmark_out="$out/$tag.json" --benchmark_out_format=json > "$out/$tag.log" 2>&1
    echo "wall time  $tag  $out/$tag.json"
  done
done

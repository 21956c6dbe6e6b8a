#!/bin/bash
# One-hop refined from the previous micro-batch against the full one-hop plan and the default,
# on rack.md's lognormal workloads where one hop is chosen (EP=72, max/mean 13, 1/2/4 experts per
# GPU) and EP=64 as 8x8 (max/mean 5, 4 per GPU); 8 micro-batches of history, 8 measured.
set -eu
F="taskset -c 1 build/bin/feplb"
T=${OUT_DIR:-/tmp/refine}; mkdir -p $T
gen() { $F trace gen --out $T/$1.trace --skew $2 --experts $3 --ranks $4 --steps 16 --model glm5-128e --force --quiet; }
gen h72e1 13 72 72; gen h72e2 13 144 72; gen h72e4 13 288 72; gen r8x8 5 256 64
for w in "h72e1 72" "h72e2 72" "h72e4 72" "r8x8 8"; do
  set -- $w
  echo "## $1 (NVLink domains of $2)"
  for mode in "default|" \
      "one-hop, rows, late copies|--one-hop 1 --prefetch 1 --copy-timing 3 --time-balance-budget 0" \
      "one-hop, time, late copies|--one-hop 1 --prefetch 1 --copy-timing 3 --time-balance-budget 0.05" \
      "refined: one-hop, rows, late copies|--one-hop 1 --one-hop-refine 1 --copy-timing 3 --time-balance-budget 0" \
      "refined: one-hop, time, late copies|--one-hop 1 --one-hop-refine 1 --copy-timing 3 --time-balance-budget 0.05"; do
    label=${mode%%|*}; args=${mode#*|}
    line=$($F simulate --trace $T/$1.trace --gpus-per-node $2 --warmup 8 --policies feplb $args 2>&1 | grep -E "^feplb ")
    printf "%-38s %s\n" "$label" "$(echo "$line" | cut -c6-)"
  done
done

#!/bin/bash
# run63: the layer priming its planner while the counts travel, A/B in the paths bench (eight
# layers on 8 virtual ranks, each forward after a GPU delay as long as the attention block, so the
# scheduler waits for the counts; the caller does not wait for the counts first, as in training):
# --paths-prime 1 (default) and 0, interleaved, three rounds with Qwen3-235B-like experts and one
# with Qwen3-30B-like ones. Everything into $OUT/b.tar.gz.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run63; mkdir -p $W
for spec in "qwen3-235b 1" "qwen3-235b 2" "qwen3-235b 3" "qwen3-30b 1"; do
  set -- $spec
  for prime in 1 0; do
    t=$(date +%s)
    timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-shape $1 --paths-steps 12 --paths-prime $prime --out $W/paths-$1-prime$prime-r$2.json > $W/paths-$1-prime$prime-r$2.log 2>&1
    echo "paths $1 prime=$prime round $2 rc=$? in $(( $(date +%s) - t )) s"
    grep -E "plans: median" $W/paths-$1-prime$prime-r$2.log | head -8 | sed -E 's/ +/ /g'
  done
done
tar -czf $OUT/b.tar.gz -C $W .

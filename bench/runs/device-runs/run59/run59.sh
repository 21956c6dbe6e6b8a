#!/bin/bash
# run59: feplb's default compares its modes at the planner time measured on the host (start-up
# p90, then the third longest of the layer's last 64 plans, every rank's largest) and its plans
# keep the knobs' reserve; the GPU tests, then `feplb run` of the default on the bundled trace
# with the measured time and with the knobs' (--reserve-from-knobs), A B A B, with rank 0's
# changes of mode.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # feplb run: the trace's ranks as virtual ranks
mkdir -p $OUT/b /tmp/runs
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 1 $OUT/b/gpu_tests.log
for round in 1 2; do
  for v in measured knobs; do
    flag=""; [[ $v == knobs ]] && flag="--reserve-from-knobs"
    t=$(date +%s)
    timeout 240 $B/bin/feplb run --policies feplb --steps 32 $flag --json /tmp/runs/run_${v}_r$round.json > /tmp/runs/run_${v}_r$round.log 2>&1
    echo "feplb run ($v) round $round rc=$? in $(( $(date +%s) - t )) s"
    grep -E "two-phase plans|modes of|^feplb  " /tmp/runs/run_${v}_r$round.log
  done
done
tar -czf $OUT/b/runs.tar.gz -C /tmp runs
# The layer's paths with the default (auto) beside the six explicit modes, both expert sizes.
for shape in qwen3-235b qwen3-30b; do
  t=$(date +%s)
  timeout 200 $B/bin/feplb_gpu_bench --sections paths --paths-shape $shape --paths-steps 12 --out $OUT/b/paths-$shape.json > $OUT/b/paths-$shape.log 2>&1
  echo "paths $shape rc=$? in $(( $(date +%s) - t )) s"
  tail -n 12 $OUT/b/paths-$shape.log
done

#!/bin/bash
# run57: the GPU tests with the live reserve floor (each forward's counts all-gather carries the
# rank's longest recent plan of the layer; a plan reserves at least every rank's largest), then
# `feplb run` of the default on the bundled trace, measured reserve vs the knobs'
# (--reserve-from-knobs), A B A B: how many two-phase plans took longer than their reserve, and
# the layer's time. The runs' logs and JSON come back as one archive (b/runs.tar.gz).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # feplb run: the trace's ranks as virtual ranks
mkdir -p $OUT/b /tmp/runs
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_tests.log
grep -E "TheDefaultReserves|FAILED" $OUT/b/gpu_tests.log | head -5
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests > $OUT/b/gpu_mp_tests.log 2>&1; echo "gpu_mp_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 1 $OUT/b/gpu_mp_tests.log
for round in 1 2; do
  for v in measured knobs; do
    flag=""; [[ $v == knobs ]] && flag="--reserve-from-knobs"
    t=$(date +%s)
    timeout 240 $B/bin/feplb run --policies feplb --steps 32 $flag --json /tmp/runs/run_${v}_r$round.json > /tmp/runs/run_${v}_r$round.log 2>&1
    echo "feplb run ($v) round $round rc=$? in $(( $(date +%s) - t )) s"
    grep -E "two-phase plans|counts ready|^feplb  " /tmp/runs/run_${v}_r$round.log
  done
done
tar -czf $OUT/b/runs.tar.gz -C /tmp runs

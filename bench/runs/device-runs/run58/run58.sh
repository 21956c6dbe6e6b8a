#!/bin/bash
# run58: after the chooser compares its candidates without the reserve floor (the layer's own mode
# re-costed as every candidate is), the GPU tests, then `feplb run` of the default on the bundled
# trace with the measured reserve and with the knobs' (--reserve-from-knobs), A B A B, now also
# counting rank 0's changes of mode: do the measured rounds' 1-3 ms plan tails of run57 remain?
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

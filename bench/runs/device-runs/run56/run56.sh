#!/bin/bash
# run56: the GPU tests with feplb's measured reserve (the runtime times feplb's two-phase modes
# when it is made and reserves at least their p99, every rank's largest), then on the H200
# machine's host CPU: `feplb planner-time` at the three target sizes (two rounds, one pinned
# core), and `feplb run` of the default policy on the bundled trace with the measured reserve and
# with the knobs' (--reserve-from-knobs), A B A B: how many two-phase plans took longer than
# their reserve in the real layer.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # feplb run: the trace's ranks as virtual ranks
mkdir -p $OUT/b
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_tests.log
grep -E "TheDefaultReserves|FAILED" $OUT/b/gpu_tests.log | head -5
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests > $OUT/b/gpu_mp_tests.log 2>&1; echo "gpu_mp_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_mp_tests.log
grep -E "Model name|^CPU\(s\)|Hypervisor" <(lscpu)
for round in 1 2; do
  for w in "--ranks 8 --experts 128" "--ranks 72 --experts 288 --gpus-per-node 72" "--ranks 256 --experts 1024 --gpus-per-node 256"; do
    t=$(date +%s)
    taskset -c 2 $B/bin/feplb planner-time $w > $OUT/b/planner_time_r${round}_$(echo $w | awk '{print $2}').log 2>&1
    echo "planner-time round $round $w rc=$? in $(( $(date +%s) - t )) s"
    grep -E "^two-phase," $OUT/b/planner_time_r${round}_$(echo $w | awk '{print $2}').log
  done
done
for round in 1 2; do
  for v in measured knobs; do
    flag=""; [[ $v == knobs ]] && flag="--reserve-from-knobs"
    t=$(date +%s)
    timeout 240 $B/bin/feplb run --policies feplb --steps 24 $flag --json $OUT/b/run_${v}_r$round.json > $OUT/b/run_${v}_r$round.log 2>&1
    echo "feplb run ($v) round $round rc=$? in $(( $(date +%s) - t )) s"
    grep -E "two-phase plans|counts ready" $OUT/b/run_${v}_r$round.log
  done
done

#!/bin/bash
# run62: the layer priming its planner while the counts travel (RuntimeConfig::prime_planner) and
# feplb.torch on the current layer:
#  1. the GPU tests (the layer primes by default in all of them);
#  2. `feplb run --policies feplb --steps 32` A B A B: primed (default) vs --no-prime;
#  3. the default planner on the host CPU: hot (plan/), after 4 or 64 MiB of other memory touched
#     (plan_cold/), and primed after 64 MiB (plan_primed/), one pinned core;
#  4. feplb.torch's tests (Megatron-Core at the pinned commit in .megatron-lm) and the grouped_mm
#     comparison (scripts/gpu-torch).
# Everything goes into $OUT/b.tar.gz (the device tool returns a few files only) and this log.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run62; mkdir -p $W/runs $W/torch
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $W/gpu_tests.log | head -20
for round in 1 2; do
  for arm in primed noprime; do
    flag=""; [[ $arm == noprime ]] && flag="--no-prime"
    t=$(date +%s)
    timeout 120 $B/bin/feplb run --policies feplb --steps 32 $flag --json $W/runs/${arm}_$round.json > $W/runs/${arm}_$round.log 2>&1
    echo "feplb run $arm round $round rc=$? in $(( $(date +%s) - t )) s"
    grep -E "two-phase plans|primed while|modes of|^feplb  " $W/runs/${arm}_$round.log
  done
done
grep -E "Model name|^CPU\(s\)|Hypervisor" <(lscpu)
F='^plan(_cold|_primed)?/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
t=$(date +%s)
LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 timeout 200 $B/bin/feplb_cpu_bench --benchmark_filter="$F" --benchmark_out=$W/cold.json --benchmark_out_format=json > $W/cold.log 2>&1
echo "cpu bench rc=$? in $(( $(date +%s) - t )) s"
grep median $W/cold.log | sed -E 's/ +/ /g; s/iterations:200\/repeats:3\/manual_time_//' | cut -c1-170
t=$(date +%s)
OUT=$W/torch timeout 300 bash scripts/gpu-torch tests grouped_mm > $W/torch.log 2>&1
echo "gpu-torch rc=$? in $(( $(date +%s) - t )) s"
cat $W/torch/summary.txt 2>/dev/null | tail -40
tar -czf $OUT/b.tar.gz -C $W .

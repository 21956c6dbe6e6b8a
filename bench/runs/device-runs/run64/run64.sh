#!/bin/bash
# run64: the session's final build on the GPU machine (this time an H100 host):
#  1. the GPU tests;
#  2. the paths bench with the layers priming (Planner::prime says whether it planned; the layer
#     counts only those), then run63's priming A/B again (--paths-prime 1 / 0, interleaved);
#  3. the default planner on the host CPU: hot, after 4 or 64 MiB touched, primed, one pinned core;
#  4. feplb.torch's tests (Megatron-Core at the pinned commit in .megatron-lm) and the grouped_mm
#     comparison (scripts/gpu-torch).
# Everything into $OUT/b.tar.gz.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run64; mkdir -p $W/torch
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
grep -E "Model name|^CPU\(s\)" <(lscpu)
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $W/gpu_tests.log | head -20
t=$(date +%s)
timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-steps 12 --out $W/paths-qwen3-235b.json > $W/paths-qwen3-235b.log 2>&1
echo "paths rc=$? in $(( $(date +%s) - t )) s"
grep -E "plans: median|rank 0 planned" $W/paths-qwen3-235b.log | sed -E 's/ +/ /g'
for spec in "qwen3-235b 1" "qwen3-235b 2" "qwen3-30b 1"; do
  set -- $spec
  for prime in 1 0; do
    t=$(date +%s)
    timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-shape $1 --paths-steps 12 --paths-prime $prime --out $W/paths-$1-prime$prime-r$2.json > $W/paths-$1-prime$prime-r$2.log 2>&1
    echo "paths $1 prime=$prime round $2 rc=$? in $(( $(date +%s) - t )) s"
    grep -E "plans: median" $W/paths-$1-prime$prime-r$2.log | head -8 | sed -E 's/ +/ /g'
  done
done
F='^plan(_cold|_primed)?/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
t=$(date +%s)
LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 timeout 150 $B/bin/feplb_cpu_bench --benchmark_filter="$F" --benchmark_out=$W/cold.json --benchmark_out_format=json > $W/cold.log 2>&1
echo "cpu bench rc=$? in $(( $(date +%s) - t )) s"
grep median $W/cold.log | sed -E 's/ +/ /g; s/iterations:200\/repeats:3\/manual_time_//' | cut -c1-170
tar -czf $OUT/b.tar.gz -C $W .
t=$(date +%s)
OUT=$W/torch timeout 280 bash scripts/gpu-torch tests grouped_mm > $W/torch.log 2>&1
echo "gpu-torch rc=$? in $(( $(date +%s) - t )) s"
tail -5 $W/torch.log
cat $W/torch/summary.txt 2>/dev/null | tail -40
tar -czf $OUT/b.tar.gz -C $W .

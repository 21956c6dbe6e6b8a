#!/bin/bash
# run51: the GPU tests (one H200; the two-GPU ones skip with their reason) and `feplb run` on the
# bundled trace, after the chooser's aim share became 0.95 and the knobs gained one_hop_refine
# (the GPU layer's path tests with `auto` plan with the chooser).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32
libdirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
  $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  -maxdepth 4 -name 'libcublas.so.13' -printf '%h\n' 2>/dev/null | sort -u | head -n 3 | tr '\n' ':')
export LD_LIBRARY_PATH="$PWD/$B/lib:${libdirs}${LD_LIBRARY_PATH:-}"
mkdir -p $OUT/b
cat $B/commit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t=$(date +%s)
$B/bin/feplb_gpu_tests --gtest_output="json:$OUT/b/gpu_tests.json" > $OUT/b/gpu_tests.log 2>&1; echo "gpu tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|tests ran" $OUT/b/gpu_tests.log | tail -n 12
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests --gtest_output="json:$OUT/b/gpu_mp_tests.json" > $OUT/b/gpu_mp_tests.log 2>&1; echo "mp tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|tests ran" $OUT/b/gpu_mp_tests.log | tail -n 6
timeout 150 $B/bin/feplb run --trace data/traces/default.json --cost-model data/cost/h200-glm5.json --steps 8 \
  --json $OUT/b/run.json --force > $OUT/b/run.log 2>&1; echo "feplb run rc=$?"; tail -n 15 $OUT/b/run.log

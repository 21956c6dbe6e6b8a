#!/bin/bash
# run45 (experiment, not a committed build: 78be3ec + reserve-experiment.patch, env-gated): the
# modes report's rack workloads at 256 and 4x72 GPUs on the H200 host CPU (one pinned core), the
# chooser's time candidates allowed beyond 72 GPUs (FEPLB_TIMEMAX=300) with their reserve scaled
# (FEPLB_RES3 = x1, x3, x5 the per-plan reserve), against the committed rule (base).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
for v in base:X=1 r1:FEPLB_TIMEMAX=300:FEPLB_RES3=1 r3:FEPLB_TIMEMAX=300:FEPLB_RES3=3 r5:FEPLB_TIMEMAX=300:FEPLB_RES3=5; do
  tag=${v%%:*}; e=${v#*:}
  t=$(date +%s)
  env ${e//:/ } timeout 140 taskset -c 3 $B/bin/feplb report --modes --workloads "4 experts per GPU, EP=2" --md $OUT/$tag.md --json $OUT/$tag.json --force > $OUT/$tag.log 2>&1
  echo "$tag rc=$? in $(( $(date +%s) - t )) s"
  grep -E "^\| [0-9]+ \| rack" $OUT/$tag.md | cut -c1-200
done

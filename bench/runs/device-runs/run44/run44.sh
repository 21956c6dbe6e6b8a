#!/bin/bash
# run44: the modes report (every workload) on the host CPU of the H200 machine, one pinned core,
# with the chooser of 1b08b43 (blends alone beyond 16 GPUs; explored with the step's prefetches).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
t=$(date +%s)
timeout 560 taskset -c 3 $B/bin/feplb report --modes --md $OUT/modes-h200host.md --json $OUT/modes-h200host.json --force > $OUT/modes.log 2>&1; echo "modes rc=$? in $(( $(date +%s) - t )) s"
grep -o "Met on [0-9]* of [0-9]*" $OUT/modes-h200host.md
grep -E "^\| [0-9]+ \|" $OUT/modes-h200host.md | grep "| no" | cut -c1-220

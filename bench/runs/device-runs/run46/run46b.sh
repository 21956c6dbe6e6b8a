#!/bin/bash
# run46b: the full modes report on the host CPU (one pinned core), measured planner time.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
t=$(date +%s)
timeout 560 taskset -c 3 $B/bin/feplb report --modes --md $OUT/modes-h200host.md --json $OUT/modes-h200host.json --force > $OUT/modes.log 2>&1; echo "modes rc=$? in $(( $(date +%s) - t )) s"
echo "met: $(grep -c '| \*\*yes\*\* |' $OUT/modes-h200host.md)"
grep -E "^\| [0-9]+ \|" $OUT/modes-h200host.md | grep "no (" | cut -c1-260

#!/bin/bash
# run67: does the default still meet its targets where the host plans slower? The modes report
# (56 workloads: the default against every explicit mode and the anchors, every plan clocked on
# the host that runs the report) on the GPU machine's host CPU, pinned to one core as on the
# development VM; then `feplb planner-time` at the three latency-target sizes on that core.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
W=/tmp/run67; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader; grep -E "Model name|^CPU\(s\)" <(lscpu); cat $B/commit
t=$(date +%s)
timeout 480 taskset -c 3 $B/bin/feplb report --modes --md $W/modes-host.md --json $W/modes-host.json --force > $W/modes.log 2>&1
echo "modes rc=$? in $(( $(date +%s) - t )) s"
echo "met: $(grep -c '| \*\*yes\*\* |' $W/modes-host.md)"
grep -E "^\| [0-9]+ \|" $W/modes-host.md | grep -v '\*\*yes\*\*' | cut -c1-260
grep -iE "geometric|met on" $W/modes-host.md | head -5 | cut -c1-300
tar -czf $OUT/b.tar.gz -C $W .
for cfg in "8 128" "72 288" "256 1024"; do
  set -- $cfg
  timeout 30 taskset -c 3 $B/bin/feplb planner-time --ranks $1 --experts $2 --domain-size $1 > $W/planner-time-ep$1.txt 2>&1
  echo "planner-time EP=$1 rc=$?"; cat $W/planner-time-ep$1.txt | tail -15
done
tar -czf $OUT/b.tar.gz -C $W .

#!/bin/bash
# run53: the GPU tests at this commit, then where the H200 machine's host CPU spends a planner's
# time: the cgroup's CPU quota and throttling, each core's clock and interrupts, and the default
# feplb planner on the three target workloads (lognormal skew 5: EP=8/E=128, EP=72/E=288 and
# EP=256/E=1024 in one domain) pinned to four different cores in turn, then the first
# core again (drift).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/b
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_tests.log
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests > $OUT/b/gpu_mp_tests.log 2>&1; echo "gpu_mp_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_mp_tests.log
{
  echo "== lscpu"; lscpu
  echo "== nproc $(nproc); affinity: $(taskset -pc $$)"
  echo "== loadavg $(cat /proc/loadavg)"
  echo "== cgroup"; cat /proc/self/cgroup
  for f in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/cpu/cpu.stat; do
    [ -r $f ] && { echo "-- $f"; cat $f; }
  done
  echo "== MHz per core"; grep MHz /proc/cpuinfo | tr '\n' ' '; echo
  echo "== cpufreq"; cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq 2>/dev/null | tr '\n' ' '; echo
  echo "== top"; top -bn1 | head -20
  echo "== interrupts (per CPU totals)"; awk 'NR==1{n=NF; next} {for(i=2;i<=n+1;i++) if ($i ~ /^[0-9]+$/) s[i-2]+=$i} END {for(c=0;c<n;c++) printf "cpu%d %d\n", c, s[c]}' /proc/interrupts
} > $OUT/b/host.txt 2>&1
head -c 1500 $OUT/b/host.txt | grep -E "Model name|^CPU\(s\)|Hypervisor|MHz" ; grep -A3 "cpu.max\|cfs_quota\|cpu.stat" $OUT/b/host.txt | head -20
F='plan/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
for run in 2 6 11 15 2b; do
  c=${run%b}
  t=$(date +%s)
  LD_LIBRARY_PATH=$PWD/$B/lib taskset -c $c $B/bin/feplb_cpu_bench --benchmark_filter="$F" --benchmark_out=$OUT/b/core$run.json --benchmark_out_format=json > $OUT/b/core$run.log 2>&1
  echo "core $run rc=$? in $(( $(date +%s) - t )) s"
  grep -E "_median" $OUT/b/core$run.log | awk '{print $1, $2, $3}'
  python3 -c "
import json; d=json.load(open('$OUT/b/core$run.json'))
for b in d['benchmarks']:
  if b.get('aggregate_name')=='median': print('  ', b['run_name'].split('/')[-1], 'p50', round(b.get('p50_us',0),1), 'p99', round(b.get('p99_us',0),1), 'stalls/s', round(b.get('stalls_per_s',0)), 'stall p50', round(b.get('stall_p50_us',0),1))
"
done
{ echo "== after"; for f in /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpu/cpu.stat; do [ -r $f ] && { echo "-- $f"; cat $f; }; done
  echo "== interrupts (per CPU totals)"; awk 'NR==1{n=NF; next} {for(i=2;i<=n+1;i++) if ($i ~ /^[0-9]+$/) s[i-2]+=$i} END {for(c=0;c<n;c++) printf "cpu%d %d\n", c, s[c]}' /proc/interrupts
  echo "== MHz per core"; grep MHz /proc/cpuinfo | tr '\n' ' '; echo; } >> $OUT/b/host.txt 2>&1
grep -A12 "== after" $OUT/b/host.txt | head -14

#!/bin/bash
# In-process A/B of two builds of the core library (README.md).
# usage: ab.sh BUILD_A BUILD_B [ROUNDS] [PLANS]  (each a CMake build dir of this repository with
# lib/libfeplb_core.so and lib/libfeplb_sim.so; headers from this checkout, which both must match)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
A=$1 B=$2 rounds=${3:-100} plans=${4:-64}
w=$(mktemp -d)
for side in A B; do
  dir=${!side}
  g++ -O2 -std=c++20 -shared -fPIC -I"$root" -I"$dir" -I"$dir/generated" "$here/ab_plans.cc" \
    -o "$w/$side.so" -L"$dir/lib" -lfeplb_sim -lfeplb_core -Wl,-rpath,"$dir/lib"
done
cp "$w/A.so" "$w/A2.so"
g++ -O2 -std=c++20 "$here/ab_main.cc" -o "$w/ab_main" -ldl
for cfg in "8 128 8" "72 288 72" "256 1024 256"; do
  set -- $cfg
  echo "B against A:  $(taskset -c 1 "$w/ab_main" "$w/A.so" "$w/B.so" $1 $2 5 $3 $rounds $plans)"
  echo "A against A:  $(taskset -c 1 "$w/ab_main" "$w/A.so" "$w/A2.so" $1 $2 5 $3 $rounds $plans)"
done
rm -rf "$w"

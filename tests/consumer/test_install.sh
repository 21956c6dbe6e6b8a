#!/usr/bin/env bash
# ctest install.consumer: `cmake --install` of the build into a temporary prefix, then this folder's
# project configured and built against it with find_package(feplb), nothing from the source tree:
# the planning program runs (on its own counts and on the installed default trace), every
# installed header compiles alone without fmt/cuBLAS/NCCL, the GPU lifecycle example compiles
# where the package has CUDA (it runs on a GPU machine: ctest -L gpu). Then the installed CLI runs
# with no LD_LIBRARY_PATH (RPATH $ORIGIN/../lib) and reads the installed data, unless
# FEPLB_DATA_DIR says otherwise.
# Usage: test_install.sh BUILD_DIR SCRATCH_DIR CMAKE CXX_COMPILER [COMPILER_LAUNCHER]
set -euo pipefail
build=$1 scratch=$2 cmake=$3 cxx=$4 launcher=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
prefix=$scratch/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$scratch/install.log"
for f in bin/feplb share/feplb/data/traces/default.json include/feplb/planning.h \
  lib/cmake/feplb/feplbConfig.cmake lib/cmake/feplb/feplbConfigVersion.cmake; do
  [[ -e $prefix/$f ]] || { echo "install: $prefix/$f missing" >&2; exit 1; }
done
ls "$prefix"/lib/libfeplb_core.so* >/dev/null
if find "$prefix/include" -path '*/internal/*' -o -name error.h -o -name check.h | grep -q .; then
  echo "install: internal headers installed:" >&2
  find "$prefix/include" -path '*/internal/*' -o -name error.h -o -name check.h >&2
  exit 1
fi

args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release)
[[ -n $launcher ]] && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
"$cmake" -S "$here" -B "$scratch/build" "${args[@]}" >"$scratch/configure.log" ||
  { cat "$scratch/configure.log" >&2; exit 1; }
grep "feplb .* at " "$scratch/configure.log"
"$cmake" --build "$scratch/build" -j 2 >"$scratch/build.log" 2>&1 || { tail -n 40 "$scratch/build.log" >&2; exit 1; }
[[ ! -e $scratch/build/lifecycle ]] || echo "GPU lifecycle example compiled against feplb::cuda"

unset LD_LIBRARY_PATH FEPLB_DATA_DIR
"$scratch/build/plan_step"
"$scratch/build/plan_step" "$prefix/share/feplb/data/traces/default.json"

# The installed CLI finds its libraries and its own data, not the source tree's.
first=$("$prefix/bin/feplb" trace info | head -n 1)
want=$(cd "$prefix" && pwd -P)/share/feplb/data/traces/default.json
[[ $first == "$want" ]] || { echo "installed feplb read '$first', expected '$want'" >&2; exit 1; }
# FEPLB_DATA_DIR comes first.
mkdir -p "$scratch/alt/traces"
cp "$prefix/share/feplb/data/traces/default.json" "$scratch/alt/traces/"
first=$(FEPLB_DATA_DIR=$scratch/alt "$prefix/bin/feplb" trace info | head -n 1)
[[ $first == "$scratch/alt/traces/default.json" ]] || { echo "FEPLB_DATA_DIR ignored: read '$first'" >&2; exit 1; }
echo "install + consumer ok"

#!/usr/bin/env bash
# Knob flags go through the one knob parser (set_knob, feplb/core/knobs.h) that the Python module
# and the C API use: a bad value gets the same one-line message from every command that takes
# knobs (python/tests/test_knobs.py checks the Python module and the C API give it too).
set -uo pipefail
bin=$(realpath "$1")
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
cd "$scratch" || exit 1
failures=()
fail() {
  echo "FAIL [$1]: $2" >&2
  failures+=("$1")
}
"$bin" trace gen --quiet --out t.json --skew 3 --experts 16 --ranks 4 --tokens-per-rank 64 \
  --model glm5-t --steps 1 >/dev/null || fail setup "trace gen failed"

# flag value: the exact stderr line.
cases=(
  "--dyn|2.5|knob dyn (--dyn): 2.5 is not an integer"
  "--dyn|4.0|"
  "--max-num-dyn|-1|knob max_num_dyn (--max-num-dyn): -1 is outside [0, 65536] experts"
  "--balance-tolerance|2|knob balance_tolerance (--balance-tolerance): 2 is outside [0, 1] x mean load"
  "--balance-tolerance|nan|knob balance_tolerance (--balance-tolerance): nan is not a finite number"
  "--balance-tolerance|1e400|knob balance_tolerance (--balance-tolerance): 1e400 is outside [0, 1] x mean load"
  "--tau|99999999999999999999|knob tau (--tau): 99999999999999999999 is outside [0, 2^32] rows"
  "--copy-gbps|fast|knob copy_gbps (--copy-gbps): 'fast' is not a number"
)
for c in "${cases[@]}"; do
  IFS='|' read -r flag value want <<<"$c"
  for cmd in "simulate --quiet --trace t.json --policies static,feplb" \
    "report --quiet --ranks 2 --steps 1 --json r.json --force" "place --trace t.json"; do
    # shellcheck disable=SC2086
    timeout 60 "$bin" $cmd "$flag" "$value" >out.txt 2>err.txt
    rc=$?
    if [[ -z $want ]]; then
      [[ $rc -eq 0 ]] || fail "$cmd $flag $value" "exit $rc: $(cat err.txt)"
      continue
    fi
    [[ $rc -eq 2 ]] || fail "$cmd $flag $value" "exit $rc, expected 2"
    [[ $(cat err.txt) == "feplb: error: $want" ]] ||
      fail "$cmd $flag $value" "stderr: $(cat err.txt); expected: feplb: error: $want"
  done
done
if [[ ${#failures[@]} -ne 0 ]]; then
  echo "knob_errors: ${#failures[@]} failed: ${failures[*]}" >&2
  exit 1
fi
echo "knob_errors: all passed"

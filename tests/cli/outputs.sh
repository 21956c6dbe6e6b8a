#!/usr/bin/env bash
# End-to-end test of how feplb writes: every input and output of a command compared before
# anything is written, symlinks written through, standard output as a file ("-") and its write
# errors, nothing half-written left behind, a user's own files never touched.
set -uo pipefail
bin=$(realpath "$1")
scratch=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$scratch"
mkdir -p "$scratch/priors"
cd "$scratch" || exit 1
cp "$repo/data/priors/olmoe-1b-7b__olmoe-repo__github.json" priors/
cp "$repo/data/cost/h200-glm5.json" cost.json

failures=()
fail() {
  echo "FAIL [$1]: $2" >&2
  failures+=("$1")
}
sum_of() { sha256sum "$1" | cut -d' ' -f1; }
# expect_error NAME TEXT CMD...: exit 2 and TEXT in the one-line error.
expect_error() {
  local name=$1 text=$2
  shift 2
  timeout 120 "$bin" "$@" >"$name.out" 2>"$name.err"
  local rc=$?
  [[ $rc -eq 2 ]] || { fail "$name" "exit $rc, expected 2: $(head -c 300 "$name.err")"; return; }
  [[ $(wc -l <"$name.err") -eq 1 ]] || fail "$name" "stderr is not one line: $(cat "$name.err")"
  grep -qF -- "$text" "$name.err" || fail "$name" "stderr lacks '$text': $(cat "$name.err")"
}

"$bin" trace gen --quiet --out t.json --skew 3 --experts 16 --ranks 4 --tokens-per-rank 64 --model glm5-t \
  --steps 2 || fail setup "trace gen failed"
small=(report --quiet --priors priors --ranks 2 --steps 1 --tokens-per-rank 64)

# Two outputs naming one file: refused before either is written.
expect_error same_file "--md and --json name the same file" "${small[@]}" --md r.out --json r.out
[[ -e r.out ]] && fail same_file "r.out was written"
printf 'mine\n' >r2.out
keep=$(sum_of r2.out)
expect_error same_file_force "name the same file" "${small[@]}" --md r2.out --json ./r2.out --force
[[ $(sum_of r2.out) == "$keep" ]] || fail same_file_force "r2.out was changed"

# An output inside the --priors directory, and one that is an input.
prior_sum=$(sum_of priors/olmoe-1b-7b__olmoe-repo__github.json)
expect_error is_prior "is a prior file" \
  "${small[@]}" --md priors/olmoe-1b-7b__olmoe-repo__github.json --force
[[ $(sum_of priors/olmoe-1b-7b__olmoe-repo__github.json) == "$prior_sum" ]] ||
  fail is_prior "the prior was overwritten"
expect_error in_priors "inside the --priors directory" "${small[@]}" --json priors/new.json
[[ -e priors/new.json ]] && fail in_priors "priors/new.json was written"
cost_sum=$(sum_of cost.json)
expect_error cost_is_output "the --cost-model table" \
  simulate --quiet --trace t.json --cost-model cost.json --json cost.json --force
[[ $(sum_of cost.json) == "$cost_sum" ]] || fail cost_is_output "cost.json was overwritten"
mkdir -p a_dir
expect_error json_dir "a_dir: is a directory" simulate --quiet --trace t.json --json a_dir --force

# A symlink is written through, never replaced (as root, /dev/stdout used to become a file).
mkdir -p real
printf 'old\n' >real/target.json
ln -s real/target.json link.json
timeout 120 "$bin" simulate --quiet --trace t.json --json link.json --force >/dev/null 2>sym.err ||
  fail symlink "exit $?: $(cat sym.err)"
[[ -L link.json ]] || fail symlink "link.json is no longer a symlink"
grep -q '"policies"' real/target.json || fail symlink "real/target.json was not written"
# Standard output named as a path (as /dev/stdout is): written to, not replaced. /dev/fd/1 is used
# here because a regression could replace the system's /dev/stdout symlink, not a /proc link.
timeout 120 "$bin" simulate --quiet --trace t.json --json /dev/fd/1 --force >dev.out 2>dev.err ||
  fail dev_fd "exit $?: $(cat dev.err)"
grep -q '"policies"' dev.out || fail dev_fd "the JSON did not reach standard output"

# A user's own FILE.tmp is not touched (outputs used to go through a fixed PATH.tmp).
printf 'mine\n' >r.json.tmp
"$bin" simulate --quiet --trace t.json --json r.json >/dev/null 2>&1 || fail user_tmp "exit $?"
[[ $(cat r.json.tmp) == mine ]] || fail user_tmp "r.json.tmp was changed"

# "-": a trace through a pipe, standard output to standard input.
"$bin" trace gen --quiet --out - --skew 2 --experts 8 --ranks 2 --tokens-per-rank 16 --steps 1 \
  --model glm5-t |
  timeout 120 "$bin" simulate --quiet --trace - --policies static,feplb >pipe.out 2>pipe.err ||
  fail stdin "exit $?: $(cat pipe.err)"
grep -q '^feplb ' pipe.out || fail stdin "no feplb row in the table"

# Write errors on standard output are exit 2 with a message.
timeout 120 "$bin" simulate --quiet --trace t.json >/dev/full 2>full.err
rc=$?
[[ $rc -eq 2 ]] || fail dev_full "exit $rc with stdout on /dev/full, expected 2"
grep -q "standard output: write failed" full.err || fail dev_full "message: $(cat full.err)"

# A full disk (a file size limit): exit 2, nothing half-written left behind.
mkdir -p full
(
  ulimit -f 4  # 4 KiB
  trap '' XFSZ
  exec timeout 120 "$bin" simulate --quiet --trace t.json --json full/big.json >/dev/null 2>fsize.err
)
rc=$?
[[ $rc -eq 2 ]] || fail fsize "exit $rc, expected 2: $(cat fsize.err)"
grep -q "write failed" fsize.err || fail fsize "message: $(cat fsize.err)"
[[ -z $(ls -A full) ]] || fail fsize "left behind: $(ls -A full)"

# Data on standard output is the data alone: the table, notes and "wrote" lines go to stderr.
is_json() { python3 -c 'import json, sys; json.load(sys.stdin)' 2>/dev/null; }
timeout 120 "$bin" simulate --quiet --trace t.json --json - >pure.out 2>pure.err ||
  fail pure_json "exit $?: $(cat pure.err)"
is_json <pure.out || fail pure_json "simulate --json - is not JSON alone: $(head -c 200 pure.out)"
grep -q '^feplb ' pure.err || fail pure_json "the table is not on stderr: $(head -c 200 pure.err)"
rm -f side.svg
timeout 120 "$bin" simulate --quiet --trace t.json --json - --plot side.svg >pure2.out 2>pure2.err ||
  fail pure_json_file "exit $?: $(cat pure2.err)"
is_json <pure2.out || fail pure_json_file "--json - with --plot FILE: not JSON alone"
grep -q '^wrote side.svg' pure2.err || fail pure_json_file "'wrote' line not on stderr"
timeout 120 "$bin" simulate --quiet --trace t.json --plot - >pure3.out 2>/dev/null
head -c 5 pure3.out | grep -q '<svg\|<?xml' || fail pure_svg "--plot -: not SVG alone: $(head -c 80 pure3.out)"
timeout 120 "$bin" "${small[@]}" --md r3.md --json - >pure4.out 2>pure4.err ||
  fail pure_report "exit $?: $(cat pure4.err)"
is_json <pure4.out || fail pure_report "report --json -: not JSON alone"
timeout 120 "$bin" place --trace t.json --out - >pure5.out 2>pure5.err ||
  fail pure_place "exit $?: $(cat pure5.err)"
is_json <pure5.out || fail pure_place "place --out -: not JSON alone: $(head -c 200 pure5.out)"
# Two outputs on standard output: refused (one stream cannot carry both).
expect_error two_stdout "both write to standard output" simulate --quiet --trace t.json --json - --plot -
[[ -s two_stdout.out ]] && fail two_stdout "something was written to stdout"
expect_error two_stdout_report "both write to standard output" "${small[@]}" --json -

# A signal while writing leaves no temporary file, and the outputs all or none (TERM and HUP: a
# background job of a script ignores INT; the C++ test FileSetCommit.ASignal... sends INT too).
"$bin" trace gen --quiet --out big.json --skew 3 --experts 128 --ranks 8 --tokens-per-rank 4096 \
  --steps 6 --model glm5-128e || fail setup "big trace"
mkdir -p intr
for i in $(seq 1 12); do
  rm -f intr/*
  "$bin" simulate --quiet --trace big.json --policies static --json intr/a.json \
    --plot intr/b.svg >/dev/null 2>&1 &
  pid=$!
  sleep "$(printf '0.%03d' $((i * 4)))"  # 4-48 ms: around the command's ~40 ms here
  kill "-$( ((i % 2)) && echo TERM || echo HUP)" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  left=$(ls -A intr)
  case "$left" in
    "" | "a.json"$'\n'"b.svg") ;;
    *) fail interrupt "round $i left: $(echo $left)" ;;
  esac
done

if [[ ${#failures[@]} -ne 0 ]]; then
  echo "outputs: ${#failures[@]} failed: ${failures[*]}" >&2
  exit 1
fi
echo "outputs: all passed"

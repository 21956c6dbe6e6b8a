#!/usr/bin/env bash
# A command writes all of its outputs or none, and checks every output path before any work:
# a full disk, a read-only directory, a FIFO nobody reads, /dev/full, a 255-byte file name, and an
# empty --ranks list.
#
# Disk-full: always with a file size limit (`ulimit -f`, SIGXFSZ ignored: writes past it fail
# with EFBIG, as they would with ENOSPC), and with small tmpfs mounts too where this process may
# mount (root with CAP_SYS_ADMIN). Read-only: a tmpfs remounted read-only where it may mount, else
# a directory without write permission where not root; as root without mounts (root writes
# anywhere) the read-only cases are skipped, and say so.
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
mounts=()
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done; }
trap cleanup EXIT

# expect_refused NAME TEXT CMD...: exit 2 within 30 s, one error line containing TEXT.
expect_refused() {
  local name=$1 text=$2
  shift 2
  timeout 30 "$bin" "$@" >"$name.out" 2>"$name.err"
  local rc=$?
  [[ $rc -eq 2 ]] || { fail "$name" "exit $rc, expected 2: $(head -c 300 "$name.err")"; return; }
  [[ $(wc -l <"$name.err") -eq 1 ]] || fail "$name" "stderr is not one line: $(cat "$name.err")"
  grep -qF -- "$text" "$name.err" || fail "$name" "stderr lacks '$text': $(cat "$name.err")"
}
# absent NAME PATH...: none of the paths exists.
absent() {
  local name=$1 p
  shift
  for p in "$@"; do [[ -e $p ]] && fail "$name" "$p was left behind"; done
}
# no_temporaries NAME DIR: no temporary file of feplb's is left in DIR.
no_temporaries() {
  local left
  left=$(find "$2" -maxdepth 1 -name '.feplb-*' | head -3)
  [[ -z $left ]] || fail "$1" "temporary files left: $left"
}

"$bin" trace gen --quiet --out t.json --skew 3 --experts 16 --ranks 4 --tokens-per-rank 64 \
  --model glm5-t --steps 2 >/dev/null || fail setup "trace gen failed"
"$bin" place --trace t.json --out p.json >/dev/null || fail setup "place failed"
small_report=(report --quiet --ranks 2 --steps 2)

# --- Disk full, emulated by a file size limit (r.md is 3 KiB, r.json 43 KiB; a.json 10 KiB,
# a.svg 17 KiB): the first output fits, the second does not; neither is left.
mkdir -p full
(
  ulimit -f 20
  trap '' XFSZ
  exec timeout 60 "$bin" "${small_report[@]}" --json full/r.json --md full/r.md >fsize1.out 2>fsize1.err
)
rc=$?
[[ $rc -eq 2 ]] || fail fsize_report "exit $rc, expected 2: $(cat fsize1.err)"
grep -q "write failed.*nothing was written" fsize1.err || fail fsize_report "message: $(cat fsize1.err)"
absent fsize_report full/r.json full/r.md
(
  ulimit -f 12
  trap '' XFSZ
  exec timeout 60 "$bin" simulate --quiet --trace t.json --json full/a.json --plot full/a.svg \
    >fsize2.out 2>fsize2.err
)
rc=$?
[[ $rc -eq 2 ]] || fail fsize_simulate "exit $rc, expected 2: $(cat fsize2.err)"
grep -q "full/a.svg: write failed.*nothing was written" fsize2.err ||
  fail fsize_simulate "message: $(cat fsize2.err)"
absent fsize_simulate full/a.json full/a.svg
no_temporaries fsize full

# --- The same on real small file systems, where this process may mount.
can_mount=0
mkdir -p tiny20 tiny16 ro
if mount -t tmpfs -o size=20k tmpfs tiny20 2>/dev/null; then
  can_mount=1
  mounts+=("$PWD/tiny20")
  mount -t tmpfs -o size=16k tmpfs tiny16 && mounts+=("$PWD/tiny16")
  expect_refused tmpfs_report "nothing was written" \
    "${small_report[@]}" --json tiny20/r.json --md tiny20/r.md
  absent tmpfs_report tiny20/r.json tiny20/r.md
  no_temporaries tmpfs_report tiny20
  expect_refused tmpfs_simulate "nothing was written" \
    simulate --quiet --trace t.json --json tiny16/a.json --plot tiny16/a.svg
  absent tmpfs_simulate tiny16/a.json tiny16/a.svg
  no_temporaries tmpfs_simulate tiny16
else
  echo "all_or_none: this process may not mount: disk-full checked with the file size limit only"
fi

# --- Read-only directories: refused before any work (report --anchors computes for 40 s), and
# the other outputs not written.
ro_ok=1
if [[ $can_mount -eq 1 ]] && mount -t tmpfs -o size=64k tmpfs ro && mounts+=("$PWD/ro") &&
  mount -o remount,ro ro; then
  :
elif [[ $(id -u) -ne 0 ]]; then
  chmod 555 ro
else
  ro_ok=0
  echo "all_or_none: root without mounts writes anywhere: read-only cases skipped"
fi
if [[ $ro_ok -eq 1 ]]; then
  expect_refused ro_plot "ro/x.svg: cannot create a file in" \
    simulate --quiet --trace t.json --json ok.json --plot ro/x.svg
  absent ro_plot ok.json
  expect_refused ro_save_placement "ro/sp.json: cannot create a file in" \
    simulate --quiet --trace t.json --placement p.json --save-placement ro/sp.json --json s2.json
  absent ro_save_placement s2.json
  expect_refused ro_json "ro/x.json: cannot create a file in" \
    report --quiet --ranks 2 --steps 1 --md rq.md --json ro/x.json
  absent ro_json rq.md
  start=$SECONDS
  expect_refused ro_plots "cannot create a file in" \
    report --quiet --anchors --plots ro --ranks 2 --steps 1 --skews none --md rp.md
  absent ro_plots rp.md
  ((SECONDS - start < 20)) || fail ro_plots "took $((SECONDS - start)) s: the work ran before the check"
fi

# --- /dev/full as one of two outputs: the other is not written; a file --force would replace
# keeps its content.
expect_refused dev_full "/dev/full: write failed" \
  simulate --quiet --trace t.json --json ok2.json --plot /dev/full
absent dev_full ok2.json
printf 'keep\n' >old.json
expect_refused dev_full_force "nothing was written" \
  simulate --quiet --trace t.json --json old.json --plot /dev/full --force
[[ $(cat old.json) == keep ]] || fail dev_full_force "old.json was replaced"
no_temporaries dev_full .

# --- A FIFO: without a reader refused at once (it used to hang); with one, written.
mkfifo fifo
expect_refused fifo_no_reader "fifo: a FIFO that no process is reading" \
  simulate --quiet --trace t.json --json fifo
timeout 30 cat fifo >fifo.got &
reader=$!
sleep 0.2
timeout 30 "$bin" simulate --quiet --trace t.json --json fifo >/dev/null 2>fifo.err ||
  fail fifo_reader "exit $?: $(cat fifo.err)"
wait "$reader"
grep -q '"policies"' fifo.got || fail fifo_reader "the reader got no JSON"

# --- A legal 255-byte file name (the temporary name must not be longer than NAME_MAX).
long=$(printf 'x%.0s' $(seq 1 250)).json
timeout 60 "$bin" simulate --quiet --trace t.json --json "$long" >/dev/null 2>long.err ||
  fail long_name "exit $?: $(cat long.err)"
grep -q '"policies"' "$long" 2>/dev/null || fail long_name "not written"

# --- An empty list is refused like --policies '', not taken for the default.
expect_refused empty_ranks "--ranks: empty" report --quiet --ranks '' --steps 1
expect_refused empty_policies "--policies" report --quiet --policies '' --steps 1
expect_refused empty_skews "--skews: empty" report --quiet --anchors --skews '' --steps 1

if [[ ${#failures[@]} -ne 0 ]]; then
  echo "all_or_none: ${#failures[@]} failed: ${failures[*]}" >&2
  exit 1
fi
echo "all_or_none: all passed"

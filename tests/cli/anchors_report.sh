#!/usr/bin/env bash
# End-to-end test of `feplb report --anchors` on a small sweep (one prior, EP 2 and 16 over two
# nodes, one skew level, few steps): it must write the Markdown, the JSON and the five SVG plots
# (well-formed XML), and keep feplb off the network.
set -uo pipefail
bin=$(realpath "$1")
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch/priors" "$scratch/plots"
cd "$scratch" || exit 1
repo=$(cd "$(dirname "$0")/../.." && pwd)
cp "$repo/data/priors/olmoe-1b-7b__olmoe-repo__github.json" priors/

fail() {
  echo "anchors_report: $1" >&2
  exit 1
}

timeout 120 "$bin" report --anchors --quiet --priors priors --ranks 2,8,16 --skews 3 --steps 2 \
  --warmup 2 --tokens-per-rank 256 --md out.md --json out.json --plots plots >run.out 2>run.err ||
  fail "exit code $?; stderr: $(head -c 400 run.err)"
[[ -s run.err ]] && fail "stderr not empty with --quiet: $(head -c 400 run.err)"
for f in out.md out.json plots/balance-token-straggler.svg plots/balance-gemm-straggler.svg \
  plots/balance-weight-bytes.svg plots/balance-pareto.svg plots/balance-cross-node.svg; do
  [[ -s $f ]] || fail "$f missing or empty"
done
for f in plots/*.svg; do
  python3 -c "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])" "$f" ||
    fail "$f is not well-formed XML"
done

grep -q '(plots/balance-pareto.svg)' out.md || fail "out.md does not link the plots relative to itself"
python3 - out.json <<'PY' || fail "out.json checks failed"
import json, sys
doc = json.load(open(sys.argv[1]))
groups = {(g["ranks"], g["workload"]): g for g in doc["groups"]}
g16 = groups[(16, "real priors")]
cells = {c["label"]: c for c in g16["cells"]}
assert cells["feplb"]["network_bytes_max"] == 0, "feplb put bytes on the network"
assert cells["moonep"]["token_straggler_max"] == 0, "moonep is not exact"
assert cells["moonep"]["transport"]["balance_sms"] == 32
assert cells["feplb"]["transport"]["balance_sms"] == 0
assert "feplb, placed homes" in cells
assert any(c["variant"] for c in groups[(8, "real priors")]["cells"]), "no Pareto variants at EP=8"
PY
echo "anchors_report: passed"

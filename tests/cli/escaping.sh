#!/usr/bin/env bash
# User text reaches SVG/XML escaped (a model name with & or </text><script> gives valid XML with no
# live element) and the terminal with its control characters shown escaped.
set -uo pipefail
bin=$(realpath "$1")
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
cd "$scratch" || exit 1
fail() {
  echo "escaping: $1" >&2
  exit 1
}

# A trace whose model name is hostile: markup, an entity, quotes, an ANSI colour escape.
"$bin" trace gen --quiet --out t.json --skew 3 --experts 8 --ranks 2 --tokens-per-rank 16 \
  --steps 1 || fail "trace gen failed"
python3 - t.json <<'PY' || fail "could not edit the trace"
import json, sys
doc = json.load(open(sys.argv[1]))
doc["model"] = "glm5 a&b </text><script>alert(1)</script> \"q\" \u001b[31mred\u001b[0m"
json.dump(doc, open(sys.argv[1], "w"))
PY
timeout 120 "$bin" simulate --quiet --trace t.json --policies static,feplb --plot p.svg \
  >table.out 2>table.err || fail "simulate: exit $?: $(cat table.err)"

python3 - p.svg <<'PY' || fail "p.svg is not valid XML or has a live element"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
tags = {el.tag.split('}')[-1] for el in root.iter()}
assert "script" not in tags, tags
text = "".join("".join(el.itertext()) for el in root.iter() if el.tag.endswith("text"))
assert "a&b </text><script>" in text, "the model name is not shown as text"
assert "\x1b" not in text, "a raw escape character in the SVG"
PY

# The terminal: no raw ESC byte from the trace, shown as \x1b instead.
if grep -q $'\x1b' table.out; then fail "a raw escape character reached the terminal"; fi
grep -qF '\x1b[31mred' table.out || fail "the escape is not shown escaped: $(head -n 1 table.out)"

# Error messages too.
timeout 120 "$bin" simulate --quiet --trace t.json --policies $'static,\e[31mx' >/dev/null 2>err.out
[[ $? -eq 2 ]] || fail "a bad policy name did not exit 2"
if grep -q $'\x1b' err.out; then fail "a raw escape character in an error message"; fi
echo "escaping: passed"

#!/usr/bin/env bash
# End-to-end bad-input test of the feplb binary: every bad trace, flag or output path must exit 2
# with one "feplb: error:" line naming the field, and never touch a file it may not write.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 FEPLB_BINARY SCRATCH_DIR" >&2
  exit 2
fi
bin=$(realpath "$1")
scratch=$2
[[ -x "$bin" ]] || { echo "bad_input: $bin is not an executable" >&2; exit 1; }
rm -rf "$scratch"
mkdir -p "$scratch"
cd "$scratch" || exit 1

failures=()
checks=0

fail() {
  echo "FAIL [$1]: $2" >&2
  failures+=("$1")
}

# Runs feplb with the given arguments (after --), saving stdout/stderr in case.out/case.err.
run_feplb() {
  local name=$1
  shift
  timeout 120 "$bin" "$@" >"$name.out" 2>"$name.err"
}

# expect_bad NAME "FIELD1|FIELD2|..." -- ARGS...: exit code exactly 2, stderr exactly one line that
# starts with "feplb: error:" and contains every FIELD (fixed strings, separated by '|').
expect_bad() {
  local name=$1 fields=$2
  shift 3
  checks=$((checks + 1))
  run_feplb "$name" "$@"
  local rc=$?
  if [[ $rc -ne 2 ]]; then
    fail "$name" "exit code $rc, expected 2 (feplb $*); stderr: $(head -c 400 "$name.err")"
    return
  fi
  local lines
  lines=$(awk 'END { print NR }' "$name.err")
  if [[ $lines -ne 1 ]]; then
    fail "$name" "stderr has $lines lines, expected 1: $(head -c 400 "$name.err")"
    return
  fi
  local line
  line=$(head -n 1 "$name.err")
  if [[ $line != "feplb: error:"* ]]; then
    fail "$name" "stderr does not start with 'feplb: error:': $line"
    return
  fi
  local field
  IFS='|' read -ra wanted <<<"$fields"
  for field in "${wanted[@]}"; do
    if [[ $line != *"$field"* ]]; then
      fail "$name" "message does not name '$field': $line"
      return
    fi
  done
}

# expect_unchanged NAME FILE SUM: FILE still has sha256 SUM.
expect_unchanged() {
  local now
  now=$(sha256sum "$2" 2>/dev/null | cut -d' ' -f1)
  if [[ "$now" != "$3" ]]; then
    fail "$1" "$2 was modified or removed"
  fi
}

sum_of() { sha256sum "$1" | cut -d' ' -f1; }

# --- Traces, written by hand: E=4 experts, R=2 ranks, S=2 tokens per rank, top-2 ------------

shape='"expert_shape":{"hidden":64,"ffn":128,"dtype":"bf16"}'
step0='{"step":0,"layer":0,"counts":[[2,1,1,0],[0,1,1,2]]}'

# doc E TOP_K R S STEPS [EXTRA]: a trace document; EXTRA (default: the shape) ends the header.
doc() {
  printf '{"format":"feplb-trace-v1","model":"tiny","num_experts":%s,"top_k":%s,' "$1" "$2"
  printf '"num_ranks":%s,"tokens_per_rank":%s,%s,"steps":[%s]}\n' "$3" "$4" "${6:-$shape}" "$5"
}
# trace STEP1: E=4, top-2, R=2, S=2 with two steps, the second of which (steps[1]) is STEP1.
trace() { doc 4 2 2 2 "$step0,$1"; }

trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[2,0,0,2]]}' >valid.json
printf '{"format":"feplb-trace-v1",' >malformed.json
printf '[1,2,3]\n' >toplevel.json
sed 's/feplb-trace-v1/feplb-trace-v2/' valid.json >format.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[2,0,2]]}' >row_length.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1]]}' >row_count.json
trace '{"step":0,"layer":1,"counts":[[2,2,2,-2],[2,0,0,2]]}' >negative.json
trace '{"step":0,"layer":1,"counts":[[1,1.5,0.5,1],[2,0,0,2]]}' >fraction.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[2.0,0,0,2]]}' >float.json
trace '{"step":0,"layer":1,"counts":[[1,"1",1,1],[2,0,0,2]]}' >string.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[1e400,0,0,2]]}' >overflow.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[3,1,0,0]]}' >above_s.json
trace '{"step":0,"layer":1,"counts":[[1,1,1,1],[2,1,0,0]]}' >row_sum.json
trace '{"step":0,"layer":0,"counts":[[1,1,1,1],[2,0,0,2]]}' >duplicate.json
trace '7' >step_type.json
doc 5 2 2 2 '{"step":0,"layer":0,"counts":[[2,2,0,0,0],[0,0,2,2,0]]}' >indivisible.json
doc 4 5 2 2 "$step0" >top_k.json
doc 4 2 2 2 '' >empty_steps.json
doc 4 2 2 2 "$step0" '"expert_shape":{"hidden":0,"ffn":128}' >shape.json
doc 4 2 2 0 '{"step":0,"layer":0,"counts":[[0,0,0,0],[0,0,0,0]]}' >zero_tokens.json
# 100000 nested arrays in "generator": must be refused, not crash (stack overflow).
nested=$(head -c 100000 /dev/zero | tr '\0' '[')$(head -c 100000 /dev/zero | tr '\0' ']')
doc 4 2 2 2 "$step0" "$shape,\"generator\":{\"a\":$nested}" >deep.json
# R=8 (E=8): fine with 4 or 8 GPUs per node, not with 3.
row8='[2,2,0,0,0,0,0,0]'
rows8=$(printf "$row8,%.0s" 1 2 3 4 5 6 7)$row8
doc 8 2 8 2 "{\"step\":0,\"layer\":0,\"counts\":[$rows8]}" >r8.json
mkdir -p a_directory
printf '{"experts":4,"top_k":2,"layers":[0],"counts":[[1,2,3,4]]}\n' >prior.json

sim=(simulate --quiet --trace)

# --- Bad traces ------------------------------------------------------------------------------

expect_bad missing_file "missing.json|no such file" -- "${sim[@]}" missing.json
expect_bad directory "a_directory|directory" -- "${sim[@]}" a_directory
expect_bad malformed "malformed.json|malformed JSON" -- "${sim[@]}" malformed.json
expect_bad top_level "toplevel.json|object" -- "${sim[@]}" toplevel.json
expect_bad format "format" -- "${sim[@]}" format.json
expect_bad row_length "steps[1].counts[1]|3 entries" -- "${sim[@]}" row_length.json
expect_bad row_count "steps[1].counts|1 rows" -- "${sim[@]}" row_count.json
expect_bad negative_count "steps[1].counts[0][3]|-2" -- "${sim[@]}" negative.json
expect_bad fraction_count "steps[1].counts[0][1]|integer" -- "${sim[@]}" fraction.json
expect_bad float_count "steps[1].counts[1][0]|integer" -- "${sim[@]}" float.json
expect_bad string_count "steps[1].counts[0][1]|integer" -- "${sim[@]}" string.json
expect_bad overflow_count "overflow.json|1e400" -- "${sim[@]}" overflow.json
expect_bad count_above_tokens "steps[1].counts[1][0]" -- "${sim[@]}" above_s.json
expect_bad row_sum "steps[1].counts[1]|sums to 3" -- "${sim[@]}" row_sum.json
expect_bad duplicate_step "steps[1]|twice" -- "${sim[@]}" duplicate.json
expect_bad step_not_object "steps[1]|object" -- "${sim[@]}" step_type.json
expect_bad indivisible "num_experts|divisible" -- "${sim[@]}" indivisible.json
expect_bad top_k "top_k" -- "${sim[@]}" top_k.json
expect_bad empty_steps "steps|empty" -- "${sim[@]}" empty_steps.json
expect_bad expert_shape "expert_shape.hidden" -- "${sim[@]}" shape.json
expect_bad deep_nesting "deep.json|nested" -- "${sim[@]}" deep.json
expect_bad info_bad_trace "steps[1].counts[1]" -- trace info row_sum.json

# --- Bad flags -------------------------------------------------------------------------------

expect_bad gpus_per_node "--gpus-per-node" -- "${sim[@]}" r8.json --gpus-per-node 3
expect_bad gpus_per_node_zero "--gpus-per-node" -- "${sim[@]}" valid.json --gpus-per-node 0
expect_bad unknown_policy "--policies|bogus" -- "${sim[@]}" valid.json --policies static,bogus
expect_bad unknown_flag "--bogus" -- "${sim[@]}" valid.json --bogus
expect_bad bad_knob "--copy-gbps" -- "${sim[@]}" valid.json --copy-gbps -1
expect_bad gen_prior_and_skew "--prior|--skew" -- \
  trace gen --quiet --out both.json --prior prior.json --skew 2
[[ -e both.json ]] && fail gen_prior_and_skew "wrote both.json"

# Every numeric flag is range-checked: no clamping, no inf/nan, the limit named.
expect_bad copy_timing_4 "--copy-timing|4|[-1, 3]" -- "${sim[@]}" valid.json --copy-timing 4
expect_bad copy_timing_99 "--copy-timing" -- "${sim[@]}" valid.json --copy-timing 99
expect_bad dyn_overflow "--dyn|9223372036854775808" -- \
  "${sim[@]}" valid.json --dyn 9223372036854775808
expect_bad copy_gbps_inf "--copy-gbps|finite" -- "${sim[@]}" valid.json --copy-gbps inf
expect_bad copy_gbps_1e400 "--copy-gbps|1e400" -- "${sim[@]}" valid.json --copy-gbps 1e400
expect_bad copy_gbps_nan "--copy-gbps" -- "${sim[@]}" valid.json --copy-gbps nan
expect_bad hidden_huge "--hidden|1099511627776" -- "${sim[@]}" valid.json --hidden 1099511627776
expect_bad dtype_unknown "--dtype|int4|bf16" -- "${sim[@]}" valid.json --dtype int4
expect_bad window_zero "--window|0" -- "${sim[@]}" valid.json --walk-forward 2 --window 0
expect_bad place_window_zero "--window|0" -- place --trace valid.json --window 0
expect_bad gen_concentration_nan "--concentration|finite" -- \
  trace gen --quiet --out c.json --skew 2 --concentration nan
expect_bad gen_experts_zero "--experts|0" -- trace gen --quiet --out c.json --skew 2 --experts 0
expect_bad gen_steps_limit "steps|134217728" -- \
  trace gen --quiet --out c.json --skew 2 --steps 2147483647
expect_bad gen_shape_limit "134217728" -- \
  trace gen --quiet --out c.json --skew 2 --ranks 16384 --experts 16384 --steps 1
[[ -e c.json ]] && fail gen_limits "wrote c.json"
expect_bad report_seed_negative "--seed" -- report --quiet --seed -1
expect_bad eplb_walk_forward "--window|--eplb-interval|eplb" -- \
  "${sim[@]}" valid.json --policies static,eplb --walk-forward 1 --window 1
# A typo names the unknown command and lists the known ones.
expect_bad typo_command "unknown command 'simulte'|simulate, place, trace" -- simulte
expect_bad typo_subcommand "unknown command 'trace gne'|gen, info" -- trace gne
# Inputs: regular files only; duplicate keys refused.
expect_bad dev_zero "/dev/zero|character device" -- "${sim[@]}" /dev/zero
mkfifo a_fifo
expect_bad fifo "a_fifo|FIFO" -- "${sim[@]}" a_fifo
sed 's/"model":"tiny",/"model":"tiny","model":"again",/' valid.json >dup_key.json
expect_bad duplicate_key "dup_key.json|duplicate key|model" -- "${sim[@]}" dup_key.json

# --- Outputs that must not be overwritten -----------------------------------------------------

printf 'keep me\n' >existing.json
keep=$(sum_of existing.json)
expect_bad gen_existing_out "existing.json|--force" -- \
  trace gen --quiet --out existing.json --skew 2 --experts 8 --ranks 2 --tokens-per-rank 16 \
  --steps 1
expect_unchanged gen_existing_out existing.json "$keep"

expect_bad json_existing "existing.json|--force" -- "${sim[@]}" valid.json --json existing.json
expect_unchanged json_existing existing.json "$keep"

input=$(sum_of valid.json)
expect_bad json_is_input "valid.json|input trace" -- \
  "${sim[@]}" valid.json --json valid.json --force
expect_unchanged json_is_input valid.json "$input"
expect_bad json_is_input_alias "input trace" -- "${sim[@]}" valid.json --json ./valid.json --force
expect_unchanged json_is_input_alias valid.json "$input"
expect_bad plot_is_input "input trace" -- "${sim[@]}" valid.json --plot valid.json --force
expect_bad warmup_all "--warmup" -- "${sim[@]}" valid.json --warmup 1
expect_bad eplb_policy "--eplb-policy" -- "${sim[@]}" valid.json --policies eplb --eplb-policy 3
expect_bad eplb_hierarchical "--eplb-policy 1" -- "${sim[@]}" valid.json --policies eplb --eplb-policy 1
expect_bad report_plots "--plots" -- report --quiet --plots a_directory
expect_bad anchors_skew "--skews" -- report --anchors --quiet --skews 0.5
expect_unchanged plot_is_input valid.json "$input"

# --- Bad placements (feplb-placement-v1) and placement flags ---------------------------------

# placement_doc E R GPN LAYERS: a document; LAYERS is the JSON list of layer objects.
placement_doc() {
  printf '{"format":"feplb-placement-v1","num_experts":%s,"num_ranks":%s,"gpus_per_node":%s,' \
    "$1" "$2" "$3"
  printf '"layers":[%s]}\n' "$4"
}
# layer L GPU0 GPU1: a layer object for valid.json's E=4, R=2 (GPUx: the gpu object's members).
layer() { printf '{"layer":%s,"gpus":[{%s},{%s}]}' "$1" "$2" "$3"; }
g0='"gpu":0,"experts":[0,1],"dynamic":[0]'
g1='"gpu":1,"experts":[2,3],"dynamic":[2]'
placement_doc 4 2 8 "$(layer 0 "$g0" "$g1"),$(layer 1 "$g1" "$g0")" >placement.json
printf '{"format":"feplb-placement-v1","num_experts":4,' >p_malformed.json
placement_doc 8 2 8 "$(layer 0 '"gpu":0,"experts":[0,1,2,3]' '"gpu":1,"experts":[4,5,6,7]')" \
  >p_expert_count.json
placement_doc 4 2 8 "$(layer 0 "$g0" '"gpu":1,"experts":[1,3]')" >p_twice.json
placement_doc 4 2 8 "$(layer 0 '"gpu":0,"experts":[0,1,2]' "$g1")" >p_per_gpu.json
placement_doc 4 2 8 "$(layer 0 "$g0" '"gpu":2,"experts":[2,3]')" >p_gpu_range.json
placement_doc 4 2 8 "$(layer 0 '"gpu":0,"experts":[0,1],"dynamic":[2]' "$g1")" >p_dyn_local.json
placement_doc 4 2 8 "$(layer 0 "$g0" "$g1")" >p_missing_layer.json
placement_doc 4 2 4 "$(layer 0 "$g0" "$g1"),$(layer 1 "$g0" "$g1")" >p_gpn.json
one_gpu='{"gpu":0,"experts":[0,1,2,3]}'
placement_doc 4 1 8 "{\"layer\":0,\"gpus\":[$one_gpu]},{\"layer\":1,\"gpus\":[$one_gpu]}" \
  >p_ranks.json

place=(simulate --quiet --trace valid.json --placement)
expect_bad placement_missing "nope.json|no such file" -- "${place[@]}" nope.json
expect_bad placement_malformed "p_malformed.json|malformed JSON" -- "${place[@]}" p_malformed.json
expect_bad placement_expert_count "p_expert_count.json|num_experts is 8|has 4" -- \
  "${place[@]}" p_expert_count.json
expect_bad placement_twice "layers[0].gpus[1].experts[0]|expert 1 appears twice" -- \
  "${place[@]}" p_twice.json
expect_bad placement_per_gpu "layers[0].gpus[0].experts|has 3 experts" -- \
  "${place[@]}" p_per_gpu.json
expect_bad placement_gpu_range "layers[0].gpus[1].gpu|outside [0, 1]" -- \
  "${place[@]}" p_gpu_range.json
expect_bad placement_dyn_local "layers[0].gpus[0].dynamic[0]|not one of GPU 0" -- \
  "${place[@]}" p_dyn_local.json
expect_bad placement_missing_layer "p_missing_layer.json|no entry for layer 1" -- \
  "${place[@]}" p_missing_layer.json
expect_bad placement_gpn "gpus_per_node is 4" -- "${place[@]}" p_gpn.json
expect_bad placement_ranks "num_ranks is 1" -- "${place[@]}" p_ranks.json
expect_bad placement_is_trace "valid.json|format|feplb-placement-v1" -- "${place[@]}" valid.json
expect_bad feplb_dyn_set "--feplb-dyn-set" -- "${sim[@]}" valid.json --feplb-dyn-set 1
expect_bad paper_dyn_set "--paper-dyn-set" -- "${sim[@]}" valid.json --paper-dyn-set 2
expect_bad feplb_dyn_set_range "--feplb-dyn-set" -- "${place[@]}" placement.json --feplb-dyn-set 2
expect_bad window_alone "--window" -- "${sim[@]}" valid.json --window 4
expect_bad walk_forward_negative "--walk-forward" -- "${sim[@]}" valid.json --walk-forward -1
expect_bad save_placement_alone "--save-placement" -- "${sim[@]}" valid.json --save-placement s.json
[[ -e s.json ]] && fail save_placement_alone "wrote s.json"
expect_bad place_no_trace "--trace" -- place
expect_bad place_bad_current "p_twice.json|layers[0].gpus[1].experts[0]" -- \
  place --trace valid.json --current p_twice.json
expect_bad place_current_mismatch "p_missing_layer.json|no entry for layer 1" -- \
  place --trace valid.json --current p_missing_layer.json
expect_bad place_homes "--place-homes" -- place --trace valid.json --place-homes 3
doc 4 2 2 2 "$step0" '"generator":{}' >noshape.json
expect_bad place_shape "expert shape|--hidden" -- place --trace noshape.json
expect_bad place_out_is_trace "valid.json|input trace" -- \
  place --trace valid.json --out valid.json --force
expect_unchanged place_out_is_trace valid.json "$input"
keep_placement=$(sum_of placement.json)
expect_bad place_out_is_current "placement.json|--current" -- \
  place --trace valid.json --current placement.json --out placement.json --force
expect_unchanged place_out_is_current placement.json "$keep_placement"
expect_bad place_existing_out "existing.json|--force" -- \
  place --trace valid.json --out existing.json
expect_unchanged place_existing_out existing.json "$keep"
expect_bad save_placement_existing "existing.json|--force" -- \
  "${place[@]}" placement.json --save-placement existing.json
expect_unchanged save_placement_existing existing.json "$keep"
expect_bad report_placement_anchors "--placement" -- report --quiet --placement --anchors
expect_bad report_window_alone "--window|--placement" -- report --quiet --window 4
expect_bad report_timing_steps "--timing-steps" -- report --quiet --placement --timing-steps 0
expect_bad report_workloads_alone "--workloads|--modes" -- report --quiet --workloads EP=8
expect_bad report_workloads_none "--workloads|zzzz-none" -- report --quiet --modes --workloads zzzz-none --md none.md
expect_bad planner_time_experts "--experts|--ranks" -- planner-time --ranks 8 --experts 100
expect_bad planner_time_domains "--ranks|--gpus-per-node" -- planner-time --ranks 12 --experts 48 --gpus-per-node 8
expect_bad planner_time_budget "--planner-budget-us" -- planner-time --planner-budget-us 30
expect_bad planner_time_size "--ranks|--experts" -- planner-time --ranks 16384 --experts 65536
expect_bad planner_time_one_mode "planner_budget_us" -- planner-time --one-hop 0 --prefetch 0 --copy-timing 1 --time-balance-budget 0
[[ -e none.md ]] && fail report_workloads_none "wrote none.md for a selection that matched no workload"

# --- Good input ------------------------------------------------------------------------------

checks=$((checks + 1))
run_feplb valid "${sim[@]}" valid.json --json out.json
rc=$?
if [[ $rc -ne 0 ]]; then
  fail valid "exit code $rc, expected 0; stderr: $(head -c 400 valid.err)"
elif [[ -s valid.err ]]; then
  fail valid "stderr not empty with --quiet: $(head -c 400 valid.err)"
elif ! grep -q '"policies"' out.json || ! grep -q '"token_straggler"' out.json; then
  fail valid "out.json lacks \"policies\" or \"token_straggler\""
fi

checks=$((checks + 1))
run_feplb zero_tokens "${sim[@]}" zero_tokens.json
rc=$?
[[ $rc -eq 0 ]] || fail zero_tokens "exit code $rc; stderr: $(head -c 400 zero_tokens.err)"

# trace gen --skew without a shape: the default shape is stored, so simulate accepts the trace.
checks=$((checks + 1))
run_feplb gen_noshape trace gen --quiet --out gen_noshape.json --skew 2 --experts 8 --ranks 2 \
  --tokens-per-rank 16 --steps 2
rc=$?
if [[ $rc -ne 0 ]]; then
  fail gen_noshape "exit code $rc; stderr: $(head -c 400 gen_noshape.err)"
else
  grep -q 'default' gen_noshape.out || fail gen_noshape "does not say the shape is the default"
  run_feplb gen_noshape_simulate "${sim[@]}" gen_noshape.json --policies static,feplb
  rc=$?
  [[ $rc -eq 0 ]] || fail gen_noshape_simulate "exit code $rc; $(head -c 400 gen_noshape_simulate.err)"
fi

checks=$((checks + 1))
run_feplb gen trace gen --quiet --out gen.json --skew 2 --experts 8 --ranks 2 --tokens-per-rank 16 \
  --steps 2 --hidden 64 --ffn 128
rc=$?
if [[ $rc -ne 0 ]]; then
  fail gen "exit code $rc, expected 0; stderr: $(head -c 400 gen.err)"
else
  run_feplb gen_simulate "${sim[@]}" gen.json --policies static,feplb
  rc=$?
  [[ $rc -eq 0 ]] || fail gen_simulate "exit code $rc; stderr: $(head -c 400 gen_simulate.err)"
fi

# An empty value is an error naming the option, never "not given" (a script's unset "$VAR").
expect_bad empty_trace "--trace|empty value" -- simulate --quiet --trace ''
expect_bad empty_json "--json|empty value" -- simulate --quiet --trace valid.json --json ''
expect_bad empty_plot "--plot|empty value" -- simulate --quiet --trace valid.json --plot ''
expect_bad empty_placement "--placement|empty value" -- simulate --quiet --trace valid.json --placement ''
expect_bad empty_save "--save-placement|empty value" -- simulate --quiet --trace valid.json --save-placement ''
expect_bad empty_cost "--cost-model|empty value" -- simulate --quiet --trace valid.json --cost-model ''
expect_bad empty_gpu "--gpu|empty value" -- simulate --quiet --trace valid.json --gpu ''
expect_bad empty_info "trace|empty value" -- trace info ''
expect_bad empty_place_out "--out|empty value" -- place --trace valid.json --out ''
expect_bad empty_md "--md|empty value" -- report --quiet --md ''
expect_bad empty_priors "--priors|empty value" -- report --quiet --priors ''
expect_bad empty_model "--model|empty value" -- trace gen --out em.json --skew 2 --model ''
# --hot-gpus: a bad item is named as what it is.
expect_bad hot_gpus_word "--hot-gpus|'abc'|not a number" -- trace gen --out hg.json --hot-gpus 1.5,abc
expect_bad hot_gpus_range "--hot-gpus|'2e9'|outside" -- trace gen --out hg.json --hot-gpus 2e9
# Two outputs on one standard output.
expect_bad two_stdout "--json|--plot|standard output" -- simulate --quiet --trace valid.json --json - --plot -

checks=$((checks + 1))
run_feplb place_good place --trace valid.json --out placed.json
rc=$?
if [[ $rc -ne 0 ]]; then
  fail place_good "exit code $rc; stderr: $(head -c 400 place_good.err)"
else
  run_feplb place_simulate "${place[@]}" placed.json --feplb-dyn-set 1 --paper-dyn-set 2
  rc=$?
  [[ $rc -eq 0 ]] || fail place_simulate "exit code $rc; stderr: $(head -c 400 place_simulate.err)"
fi

if [[ ${#failures[@]} -ne 0 ]]; then
  echo "bad_input: ${#failures[@]} of $checks cases failed: ${failures[*]}" >&2
  exit 1
fi
echo "bad_input: all $checks cases passed"

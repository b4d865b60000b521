#!/usr/bin/env bash
# The test command (make test): lint, unit and integration tests, ansible-test sanity, the collection build,
# and every molecule scenario on systemd containers from the local node image.
#   MOLECULE_SCENARIOS="preflight firewall" make test   # only these scenarios
#   GPUCLUSTER_HEAVY=1 make test                       # also the heavy scenarios
#   MOLECULE_LANES=1 make test                         # the scenarios one at a time (default: two at a time)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh

passed=0; failed=0; failures=()
declare -a timings
# Each step's output is kept; the summary ends with the last lines of every step that failed, so the reason is
# in the last screen of a long run (a CI log is often read from its end).
step_logs=$(mktemp -d)
trap 'rm -rf "$step_logs"' EXIT
step() {
  local name=$1; shift
  local start=$SECONDS rc
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$step_logs/$name.log"; rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1)); timings+=("ok    $(printf '%4d' $((SECONDS - start)))s  $name")
  else
    failed=$((failed + 1)); failures+=("$name"); timings+=("FAIL  $(printf '%4d' $((SECONDS - start)))s  $name")
  fi
}
# the lines that say why a step failed: pytest's FAILED/ERROR lines where it wrote them, else the last 30
failure_tail() {
  if grep -q '^\(FAILED\|ERROR\) ' "$1"; then
    grep '^\(FAILED\|ERROR\) ' "$1" | tail -n 30
  else
    tail -n 30 "$1"
  fi
}

check_collection() {
  # The collection builds, installs, and every module renders with ansible-doc.
  local dist=.build/dist inst
  rm -rf "$dist" && mkdir -p "$dist"
  inst=$(mktemp -d)
  ansible-galaxy collection build --force --output-path "$dist" . >/dev/null || return 1
  # --force: without it ansible-galaxy sees the linked checkout and installs nothing here.
  ansible-galaxy collection install --offline --no-deps --force -p "$inst" "$dist"/gpucluster-multinode-*.tar.gz >/dev/null || return 1
  [ -f "$inst/ansible_collections/gpucluster/multinode/MANIFEST.json" ] || { echo "the built collection did not install"; return 1; }
  local m rc=0 doc
  for m in plugins/modules/*.py; do
    m=$(basename "$m" .py)
    # ansible-doc exits 0 with a warning when it cannot load a module: read what it printed.
    if ! doc=$(ANSIBLE_COLLECTIONS_PATH="$inst" ansible-doc "gpucluster.multinode.$m" 2>&1) \
        || grep -q 'was not found\|Error loading plugin' <<<"$doc" \
        || ! grep -q "^> MODULE .*gpucluster.multinode.$m" <<<"$doc"; then
      echo "ansible-doc failed for gpucluster.multinode.$m:"; head -5 <<<"$doc"; rc=1
    fi
  done
  rm -rf "$inst"
  return $rc
}

step yamllint yamllint --strict .
step ansible-lint ansible-lint --profile production
# The node image first: the bad-input battery (pytest) runs on two nodes made from it.
step node-image ansible-playbook lab/lab.yml -i lab/controller.yml -e lab_state=image
GPUCLUSTER_NODE_IMAGE=$(cat .lab/node-image 2>/dev/null)
export GPUCLUSTER_NODE_IMAGE
step pytest pytest -q
step sanity bash scripts/sanity.sh
step collection-build check_collection

scenarios=${MOLECULE_SCENARIOS:-}
if [ -z "$scenarios" ]; then
  for d in molecule/*/molecule.yml; do
    s=$(basename "$(dirname "$d")")
    if grep -q '^# gpucluster: heavy' "$d" && [ -z "${GPUCLUSTER_HEAVY:-}" ]; then
      echo "=== molecule $s: heavy, skipped (GPUCLUSTER_HEAVY=1 runs it)"; continue
    fi
    scenarios="$scenarios $s"
  done
fi
# The scenarios run MOLECULE_LANES at a time (default 2: each lane takes the next scenario from one queue, the
# longest first, each one's output printed whole when it ends; 1 runs them one after another).
run_scenarios() {
  local lanes=${MOLECULE_LANES:-2} logs queue s first=() rest=()
  logs=$(mktemp -d); queue=$logs/queue
  for s in training health ssh_trust nfs; do  # the longest, in this order
    case " $scenarios " in *" $s "*) first+=("$s") ;; esac
  done
  for s in $scenarios; do
    case " ${first[*]} " in *" $s "*) ;; *) rest+=("$s") ;; esac
  done
  printf '%s\n' "${first[@]}" "${rest[@]}" | grep . > "$queue"
  lane() {
    local s start rc
    while true; do
      s=$(flock "$logs/queue.lock" sh -c 'head -1 "$1"; sed -i 1d "$1"' _ "$queue")
      [ -n "$s" ] || return 0
      start=$SECONDS
      molecule test -s "$s" > "$logs/$s.log" 2>&1; rc=$?
      flock "$logs/print.lock" sh -c 'echo "=== molecule $1 (lane $2): molecule test -s $1"; cat "$3"' _ "$s" "$1" "$logs/$s.log"
      [ "$rc" -eq 0 ] || cp "$logs/$s.log" "$step_logs/molecule $s.log"
      echo "$rc $((SECONDS - start)) $s" >> "$logs/results"
    done
  }
  for i in $(seq 1 "$lanes"); do lane "$i" & done
  wait
  local rc secs name
  while read -r rc secs name; do
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1)); timings+=("ok    $(printf '%4d' "$secs")s  molecule $name")
    else
      failed=$((failed + 1)); failures+=("molecule $name"); timings+=("FAIL  $(printf '%4d' "$secs")s  molecule $name")
    fi
  done < "$logs/results"
  rm -rf "$logs"
}
if [ -n "${scenarios// /}" ]; then
  lanes_start=$SECONDS
  run_scenarios
  timings+=("      $(printf '%4d' $((SECONDS - lanes_start)))s  the scenarios, ${MOLECULE_LANES:-2} at a time")
fi

echo
echo "=== summary"
printf '%s\n' "${timings[@]}"
if [ "$failed" -ne 0 ]; then
  for name in "${failures[@]}"; do
    echo; echo "=== why $name failed (its last lines; the whole output is above)"
    failure_tail "$step_logs/$name.log"
  done
  echo
  printf 'failed: %s\n' "${failures[*]}"
fi
echo "test steps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Wall time of the health quick tier on labs of N nodes (default 4 16 32), and the ratio of the
# largest measured size to the smallest. The goal: 32 nodes under 3x the time of 4.
#   benchmarks/health_quick.sh                         # NODES="4 16 32" ROUNDS=2
#   NODES="4 8" ROUNDS=1 benchmarks/health_quick.sh
# The lab (LAB_NAME, LAB_SUBNET) is grown to each size in turn (lab.yml -e lab_nodes=N) and
# removed at the end unless KEEP_LAB=1. The first run at each size is a warm-up (SSH control
# sockets, Python byte code on new nodes) and is not counted; the best of ROUNDS is printed.
# New nodes are bare lab nodes (no site.yml): the quick tier still runs every check and
# reports what is missing, which is what is timed. A size whose lab cannot be made within
# LAB_UP_TIMEOUT seconds is reported and skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
NODES=${NODES:-4 16 32}
ROUNDS=${ROUNDS:-2}
LAB_NAME=${LAB_NAME:-lab-health}
LAB_SUBNET=${LAB_SUBNET:-10.213.50.0/24}
LAB_UP_TIMEOUT=${LAB_UP_TIMEOUT:-1800}
INV=inventories/$LAB_NAME
LOG=${LOG_DIR:-$(mktemp -d /tmp/health-bench.XXXXXX)}
mkdir -p "$LOG"
lab() {
  timeout "$LAB_UP_TIMEOUT" ansible-playbook playbooks/lab.yml -e lab_name="$LAB_NAME" -e lab_subnet="$LAB_SUBNET" \
    -e lab_inventory_dir="$INV" "$@" >>"$LOG/lab.log" 2>&1
}
quick() {  # prints the wall time of one quick-tier run
  local t0 t1
  t0=$(date +%s.%N)
  ansible-playbook playbooks/health.yml -i "$INV" -e health_report_dir=/var/lib/gpucluster/health-bench \
    >"$LOG/quick-$1.log" 2>&1   # exits 2 on bare nodes: failures are expected there
  t1=$(date +%s.%N)
  grep -q "Summarise the health of the cluster" "$LOG/quick-$1.log" || { echo "quick tier did not finish: $LOG/quick-$1.log" >&2; return 1; }
  echo "$t1 - $t0" | bc
}
declare -A best
measured=()
for n in $NODES; do
  echo "=== $n node(s): lab up (log $LOG/lab.log)"
  if ! lab -e lab_nodes="$n"; then
    echo "lab of $n node(s) could not be made within $LAB_UP_TIMEOUT s; skipped (see $LOG/lab.log)"
    continue
  fi
  quick "$n-warm" >/dev/null || continue
  times=()
  for r in $(seq "$ROUNDS"); do t=$(quick "$n-$r") && times+=("$t"); done
  [ "${#times[@]}" -gt 0 ] || continue
  best[$n]=$(printf '%s\n' "${times[@]}" | sort -n | head -1)
  measured+=("$n")
  printf 'quick tier, %2d node(s): %.1f s (best of: %s), load average %s\n' "$n" "${best[$n]}" "${times[*]}" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
done
[ -n "${KEEP_LAB:-}" ] || lab -e lab_state=absent
if [ "${#measured[@]}" -ge 2 ]; then
  first=${measured[0]}; last=${measured[-1]}
  printf 'ratio %s/%s nodes: %.2f (goal for 32/4: under 3)\n' "$last" "$first" "$(echo "${best[$last]} / ${best[$first]}" | bc -l)"
fi
echo "logs: $LOG"

#!/usr/bin/env bash
# Wall time of the health quick tier on labs of N nodes (default 4 16 32), and the ratio of the
# largest to the smallest. The goal: 32 nodes under 3x the time of 4.
#   benchmarks/health_quick.sh                    # NODES="4 16 32" ROUNDS=2
#   NODES="4 8" ROUNDS=1 benchmarks/health_quick.sh
# Each size is a lab of its own (LAB_NAME, LAB_SUBNET), created, measured, and removed; the
# first run on a fresh lab is a warm-up (SSH host keys, control sockets, Python byte code) and
# is not counted. The nodes are bare lab nodes (no site.yml): the quick tier runs every check
# and reports what is missing, which is what is timed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
NODES=${NODES:-4 16 32}
ROUNDS=${ROUNDS:-2}
LAB_NAME=${LAB_NAME:-lab-health}
LAB_SUBNET=${LAB_SUBNET:-10.213.50.0/24}
INV=inventories/$LAB_NAME
KEEP_LAB=${KEEP_LAB:-}
lab() { ansible-playbook playbooks/lab.yml -e lab_name="$LAB_NAME" -e lab_subnet="$LAB_SUBNET" -e lab_inventory_dir="$INV" "$@" >/dev/null; }
quick() {
  local t0 t1
  t0=$(date +%s.%N)
  ansible-playbook playbooks/health.yml -i "$INV" -e health_report_dir=/var/lib/gpucluster/health-bench \
    -e health_shared_must_be_mount=true >/tmp/health-bench-$1.log 2>&1 || true   # failures expected on bare nodes
  t1=$(date +%s.%N)
  grep -q "Summarise the health of the cluster" /tmp/health-bench-$1.log || { echo "quick tier did not finish: /tmp/health-bench-$1.log" >&2; exit 1; }
  echo "$t1 - $t0" | bc
}
declare -A best
for n in $NODES; do
  echo "=== $n node(s): lab up"
  lab -e lab_nodes="$n"
  quick "$n-warm" >/dev/null
  times=()
  for r in $(seq "$ROUNDS"); do times+=("$(quick "$n-$r")"); done
  best[$n]=$(printf '%s\n' "${times[@]}" | sort -n | head -1)
  printf 'quick tier, %2d node(s): %s s (best of %s: %s), load average %s\n' "$n" "${best[$n]}" "$ROUNDS" \
    "${times[*]}" "$(cut -d' ' -f1-3 /proc/loadavg)"
  [ -n "$KEEP_LAB" ] || lab -e lab_state=absent
done
first=$(echo "$NODES" | awk '{print $1}'); last=$(echo "$NODES" | awk '{print $NF}')
ratio=$(echo "scale=2; ${best[$last]} / ${best[$first]}" | bc)
echo "ratio ${last}/${first} nodes: $ratio (goal: under 3)"

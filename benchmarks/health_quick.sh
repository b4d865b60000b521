#!/usr/bin/env bash
# Wall time of the health quick tier on labs of N nodes (default 4 16 32), and the ratio of the
# largest measured size to the smallest. The goal: 32 nodes under 3x the time of 4.
#   benchmarks/health_quick.sh                         # NODES="4 16 32" ROUNDS=2
#   NODES="4 8" ROUNDS=1 benchmarks/health_quick.sh
# The lab (LAB_NAME, LAB_SUBNET) is made each size in turn (lab.yml -e lab_nodes=N grows or
# shrinks it; NODES="32 16 4" makes the large lab once) and removed at the end unless KEEP_LAB=1. The first run at each size is a warm-up (SSH control
# sockets, Python byte code on new nodes) and is not counted; the best of ROUNDS is printed,
# then the five slowest tasks of one more run with ansible.posix.profile_tasks (PROFILE="" skips
# it). Before timing, it waits (2 min at most) for the load average to fall under the core count.
# After the lab is grown, `site.yml --tags network` (PREPARE_TAGS) gives every node its name in
# /etc/hosts, as on a configured cluster; the rest is left bare (no training environment, no
# NCCL settings, no shared mount): the quick tier still runs every check and reports what is
# missing, which is what is timed. PREPARE_TAGS="" times bare nodes, where every name lookup
# goes to DNS. A size whose lab cannot be made within LAB_UP_TIMEOUT seconds is reported and
# skipped. Many nodes need the host's fs.inotify.max_user_instances raised (lab.yml says so).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
NODES=${NODES:-4 16 32}
ROUNDS=${ROUNDS:-2}
LAB_NAME=${LAB_NAME:-lab-hbench}
LAB_SUBNET=${LAB_SUBNET:-10.213.51.0/24}
LAB_UP_TIMEOUT=${LAB_UP_TIMEOUT:-1800}
PREPARE_TAGS=${PREPARE_TAGS-network}
INV=inventories/$LAB_NAME
LOG=${LOG_DIR:-$(mktemp -d /tmp/health-bench.XXXXXX)}
mkdir -p "$LOG"
lab() {
  timeout "$LAB_UP_TIMEOUT" ansible-playbook lab/lab.yml -e lab_name="$LAB_NAME" -e lab_subnet="$LAB_SUBNET" \
    -e lab_inventory_dir="$INV" "$@" >>"$LOG/lab.log" 2>&1
}
busy() {  # CPU seconds the whole machine has been busy (controller and lab nodes share its cores)
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2 + $3 + $4 + $7 + $8 + $9) / hz}' /proc/stat
}
quick() {  # prints the wall time and the machine's busy CPU seconds of one quick-tier run
  local t0 t1 c0 c1
  c0=$(busy)
  t0=$(date +%s.%N)
  ansible-playbook playbooks/health.yml -i "$INV" -e health_report_dir=/var/lib/gpucluster/health-bench \
    >"$LOG/quick-$1.log" 2>&1   # exits 2 on bare nodes: failures are expected there
  t1=$(date +%s.%N)
  c1=$(busy)
  grep -q "Summarise the health of the cluster" "$LOG/quick-$1.log" || { echo "quick tier did not finish: $LOG/quick-$1.log" >&2; return 1; }
  echo "$(echo "$t1 - $t0" | bc) $(echo "$c1 - $c0" | bc)"
}
settle() {  # wait (2 min at most) until the 1-minute load is under the core count: the lab's nodes share them
  local i cores; cores=$(nproc)
  for i in $(seq 24); do
    awk -v c="$cores" '{exit !($1 < c)}' /proc/loadavg && return 0
    sleep 5
  done
}
profiled() {  # the five slowest tasks of one more run (ansible.posix.profile_tasks), not counted
  ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks ansible-playbook playbooks/health.yml -i "$INV" \
    -e health_report_dir=/var/lib/gpucluster/health-bench >"$LOG/profile-$1.log" 2>&1
  # profile_tasks lists the tasks slowest first: "<role> : <task> ------ 2.34s"
  grep -E -- ' -{3,} [0-9]+\.[0-9]+s$' "$LOG/profile-$1.log" | head -5 | sed -E 's/ -+ / /; s/^/    /'
}
declare -A best
measured=()
for n in $NODES; do
  echo "=== $n node(s): lab up (log $LOG/lab.log)"
  if ! lab -e lab_nodes="$n"; then
    echo "lab of $n node(s) could not be made within $LAB_UP_TIMEOUT s; skipped (see $LOG/lab.log)"
    continue
  fi
  if [ -n "$PREPARE_TAGS" ] && ! ansible-playbook playbooks/site.yml -i "$INV" --tags "$PREPARE_TAGS" >>"$LOG/prepare.log" 2>&1; then
    echo "site.yml --tags $PREPARE_TAGS failed on $n node(s); skipped (see $LOG/prepare.log)"
    continue
  fi
  settle
  quick "$n-warm" >/dev/null || continue
  runs=()
  for r in $(seq "$ROUNDS"); do t=$(quick "$n-$r") && runs+=("$t"); done
  [ "${#runs[@]}" -gt 0 ] || continue
  bestrun=$(printf '%s\n' "${runs[@]}" | sort -n | head -1)
  best[$n]=${bestrun% *}
  measured+=("$n")
  printf 'quick tier, %2d node(s): %.1f s (best of: %s), machine CPU busy %.1f s of %d core(s) x %.1f s, load average %s\n' \
    "$n" "${best[$n]}" "$(printf '%s\n' "${runs[@]}" | cut -d' ' -f1 | xargs)" "${bestrun#* }" "$(nproc)" "${best[$n]}" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  [ -n "${PROFILE:-1}" ] && { echo "  slowest tasks of a profiled run:"; profiled "$n"; }
done
[ -n "${KEEP_LAB:-}" ] || lab -e lab_state=absent
if [ "${#measured[@]}" -ge 2 ]; then
  sorted=$(printf '%s\n' "${measured[@]}" | sort -n)
  first=$(head -1 <<<"$sorted"); last=$(tail -1 <<<"$sorted")
  printf 'ratio %s/%s nodes: %.2f (goal for 32/4: under 3)\n' "$last" "$first" "$(echo "${best[$last]} / ${best[$first]}" | bc -l)"
fi
echo "logs: $LOG"

#!/usr/bin/env bash
# The four speed figures in one run, each against its goal, on labs this script makes and removes:
#   1. the first DeepSpeed job after site.yml against the jobs after it: `train.yml` to the head's
#      first logged step (benchmarks/first_job.sh; goal: ratio 1.5 or less);
#   2. site.yml on the converged 4-node lab against its first run on the fresh lab, wall time
#      (goal: 0.25 or less); the converged run's slowest tasks are printed (profile_tasks);
#   3. the bandwidth module on one pair against iperf3 typed by hand on the same pair, ROUNDS rounds
#      alternating, ratio of the medians (benchmarks/network_matrix.sh part 2; goal: 0.9 or more);
#   4. all 28 pairs of 8 nodes one pair at a time against round-robin, wall time of
#      bandwidth.yml (network_matrix.sh part 1; goal: 3.3 or more).
# Figures 1-3 come from a fresh 4-node lab, figure 4 from a fresh 8-node lab (the network and
# node_tools steps only: the matrix needs names and iperf3). The machine's load is printed with
# every figure: the lab's nodes share this machine's CPUs, so read the ratios.
#
#   benchmarks/speed.sh                  # ROUNDS=5 JOBS=3 PARTS="1 2 3 4" KEEP=0
#   PARTS=4 benchmarks/speed.sh          # the matrix only
#   LOGS=/tmp/speed-logs benchmarks/speed.sh   # keep every playbook's log
# Needs the node image (ansible-playbook lab/lab.yml -e lab_state=image). KEEP=1 leaves the labs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
ROUNDS=${ROUNDS:-5}
JOBS=${JOBS:-3}
PARTS=${PARTS:-1 2 3 4}
KEEP=${KEEP:-0}
LOGS=${LOGS:-}      # a directory to keep the playbook logs in (for example the converged run's profile)
part() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=$(mktemp -d /tmp/speed.XXXXXX)
load() { printf 'load %s (%s cores)' "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)"; }
now() { date +%s.%N; }
summary=()

# lab NAME NODES SUBNET STATE: make or remove a lab; its inventory is .lab/NAME-inventory
lab() {
  ansible-playbook lab/lab.yml -e "lab_name=$1" -e "lab_nodes=$2" -e "lab_subnet=$3" \
    -e "lab_inventory_dir=$PWD/.lab/$1-inventory" -e "lab_state=$4" >"$OUT/lab-$1-$4.log" 2>&1 \
    || { tail -20 "$OUT/lab-$1-$4.log" >&2; return 1; }
}
cleanup() {
  if [ "$KEEP" != 1 ]; then
    lab speed4 4 10.213.60.0/24 absent || true
    lab speed8 8 10.213.61.0/24 absent || true
  fi
  if [ -n "$LOGS" ]; then mkdir -p "$LOGS" && cp -r "$OUT"/. "$LOGS"/; fi
  rm -rf "$OUT"
}
trap cleanup EXIT

if part 1 || part 2 || part 3; then
  INV4=.lab/speed4-inventory
  echo "== a fresh 4-node lab ($(load))"
  lab speed4 4 10.213.60.0/24 absent
  lab speed4 4 10.213.60.0/24 present
  t0=$(now)
  ansible-playbook playbooks/site.yml -i "$INV4" >"$OUT/site-first.log" 2>&1 || { tail -30 "$OUT/site-first.log" >&2; exit 1; }
  first=$(echo "$(now) - $t0" | bc)
  echo "site.yml, first run on the fresh lab: $(printf '%.0f' "$first") s ($(load))"
  if part 2; then
    t0=$(now)
    ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=12 \
      ansible-playbook playbooks/site.yml -i "$INV4" >"$OUT/site-again.log" 2>&1 || { tail -30 "$OUT/site-again.log" >&2; exit 1; }
    again=$(echo "$(now) - $t0" | bc)
    echo "site.yml, converged: $(printf '%.0f' "$again") s ($(load)); $(grep -o 'changed=[0-9]*' "$OUT/site-again.log" | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
    echo "   its slowest tasks:"
    sed -n '/^=====/,$p' "$OUT/site-again.log" | grep -E ' -+ [0-9.]+s$' | head -12 | sed 's/^/   /'
    row=$(echo "scale=3; $again / $first" | bc | sed 's/^\./0./')
    summary+=("2. site.yml converged / first run (4 nodes)       $row   goal <= 0.25   ($(printf '%.0f' "$again") s / $(printf '%.0f' "$first") s)")
  fi
  if part 1; then
    echo "== the first DeepSpeed job against the $JOBS after it"
    INV=$INV4 ROUNDS=$JOBS benchmarks/first_job.sh | tee "$OUT/first-job.txt"
    row=$(sed -n 's/^ratio first \/ later: *\([0-9.]*\).*/\1/p' "$OUT/first-job.txt")
    summary+=("1. first DeepSpeed job / later jobs, to step 1   $row   goal <= 1.5")
  fi
  if part 3; then
    echo "== one pair: the bandwidth module against iperf3 by hand"
    INV=$INV4 PARTS=2 ROUNDS=$ROUNDS benchmarks/network_matrix.sh | tee "$OUT/pair.txt"
    echo "   ($(load))"
    row=$(sed -n 's/^ratio module \/ by hand: *\([0-9.]*\).*/\1/p' "$OUT/pair.txt")
    summary+=("3. bandwidth module / iperf3 by hand, one pair       $row   goal >= 0.9    (median of $ROUNDS)")
  fi
  [ "$KEEP" = 1 ] || lab speed4 4 10.213.60.0/24 absent
fi

if part 4; then
  INV8=.lab/speed8-inventory
  echo "== a fresh 8-node lab with names and iperf3 ($(load))"
  lab speed8 8 10.213.61.0/24 absent
  lab speed8 8 10.213.61.0/24 present
  ansible-playbook playbooks/site.yml -i "$INV8" --tags network,node_tools \
    -e node_tools_build=false -e node_tools_pdsh=false >"$OUT/site8.log" 2>&1 || { tail -30 "$OUT/site8.log" >&2; exit 1; }
  INV=$INV8 PARTS=1 MATRIX_NODES=8 benchmarks/network_matrix.sh | tee "$OUT/matrix.txt"
  echo "   ($(load))"
  row=$(sed -n 's/.*ratio sequential \/ round-robin \([0-9.]*\).*/\1/p' "$OUT/matrix.txt")
  summary+=("4. all pairs of 8 nodes, sequential / round-robin $(printf '%.2f' "$row")   goal >= 3.3")
fi

echo "== speed figures ($(date -u +%Y-%m-%dT%H:%MZ), $(load))"
printf '%s\n' "${summary[@]}" | sort

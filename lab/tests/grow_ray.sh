#!/usr/bin/env bash
# Growing a cluster that runs Ray, as a user does: a lab of three nodes whose inventory first
# lists two (head + one worker) with cluster_ray_enabled: true; site.yml converges them (Ray included),
# then the third node is added to the inventory and ONE site.yml run must bring it to what the
# others have (the training environment, NCCL settings, Ray joined to the head). Then torchrun
# and deepspeed train across all three nodes (world 4: 2 ranks on the head, 1 per worker), and
# GROW_BACK_TO_BACK deepspeed jobs start one right after the other: none may be refused by the
# launch preflight (the nodes log users in through systemd-logind, as a server install does).
#
#   lab/tests/grow_ray.sh            # makes the lab, runs everything, removes the lab
#
# Settings (environment): GROW_LAB_NAME (lab-grow), GROW_LAB_SUBNET (10.213.53.0/24),
# GROW_KEEP=1 keeps the lab at the end, GROW_BACK_TO_BACK (3). Ray's wheels (~110 MB) are
# downloaded once into .lab/ray-wheelhouse and mounted on the nodes with the lab's wheelhouse.
# Heavy: 14 minutes (822 s) beside a make test run on a 2-core machine (see docs/logind.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

LAB=${GROW_LAB_NAME:-lab-grow}
SUBNET=${GROW_LAB_SUBNET:-10.213.53.0/24}
BACK_TO_BACK=${GROW_BACK_TO_BACK:-3}
STATE=.lab/$LAB-grow
RAY_WHEELS=$PWD/.lab/ray-wheelhouse
mkdir -p "$STATE"
LOG=$STATE/run.log
: > "$LOG"
start=$(date +%s)
step() { echo "== $(( $(date +%s) - start ))s $*" | tee -a "$LOG"; }
fail() { echo "FAIL: $*" | tee -a "$LOG"; finish 1; }
finish() {
    if [ "${GROW_KEEP:-0}" != 1 ]; then
        ansible-playbook lab/lab.yml -e lab_name="$LAB" -e lab_inventory_dir="$PWD/$STATE/inv-all" \
            -e lab_state=absent >> "$LOG" 2>&1
    fi
    step "done (rc $1)"
    exit "$1"
}

step "Ray's wheels in $RAY_WHEELS"
python3 -m pip download --quiet --only-binary=:all: --dest "$RAY_WHEELS" 'ray[default]==2.60.0' >> "$LOG" 2>&1 \
    || fail "pip download ray"

step "lab $LAB: three nodes on $SUBNET"
# An inventory variable, not -e: the lab role adds its own wheelhouse to lab_extra_volumes.
printf 'all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: "{{ ansible_playbook_python }}"\n      lab_extra_volumes: ["%s:/opt/ray-wheelhouse:ro"]\n' \
    "$RAY_WHEELS" > "$STATE/lab-vars.yml"
ansible-playbook lab/lab.yml -i "$STATE/lab-vars.yml" -e lab_name="$LAB" -e lab_subnet="$SUBNET" -e lab_nodes=3 \
    -e lab_inventory_dir="$PWD/$STATE/inv-all" >> "$LOG" 2>&1 || fail "lab.yml"

# The same variables for both inventories: Ray on, its wheels offline, and the lab's own settings.
python3 - "$STATE" <<'EOF' || fail "inventories"
import copy, sys, yaml
state = sys.argv[1]
with open(state + '/inv-all/hosts.yml') as handle:
    inv = yaml.safe_load(handle)
v = inv['all']['vars']
v.update(cluster_ray_enabled=True, cluster_pip_find_links=['/opt/wheelhouse', '/opt/ray-wheelhouse'],
         ray_object_store_memory=104857600, ray_start_timeout=420,
         ray_environment={'RAY_DASHBOARD_STARTUP_TIMEOUT_S': '300'})
with open(state + '/inv-all/hosts.yml', 'w') as handle:
    yaml.safe_dump(inv, handle, sort_keys=False)
two = copy.deepcopy(inv)
workers = two['all']['children']['cluster']['children']['workers']['hosts']
new = sorted(workers)[-1]
del workers[new]
import os
os.makedirs(state + '/inv-two', exist_ok=True)
with open(state + '/inv-two/hosts.yml', 'w') as handle:
    yaml.safe_dump(two, handle, sort_keys=False)
with open(state + '/new-node', 'w') as handle:
    handle.write(new + '\n')
EOF
NEW=$(cat "$STATE/new-node")

step "site.yml on two nodes (cluster_ray_enabled: true)"
ansible-playbook playbooks/site.yml -i "$STATE/inv-two" > "$STATE/site-two.out" 2>&1 || fail "site.yml on two nodes: $(tail -20 "$STATE/site-two.out")"

step "Ray runs on the two nodes"
ansible-playbook playbooks/ray.yml -i "$STATE/inv-two" -e ray_state=status > "$STATE/ray-two.out" 2>&1 \
    || fail "ray status on two nodes: $(tail -20 "$STATE/ray-two.out")"

step "$NEW added to the inventory: ONE site.yml run"
ansible-playbook playbooks/site.yml -i "$STATE/inv-all" > "$STATE/site-grow.out" 2>&1 \
    || fail "site.yml after adding $NEW: $(grep -A12 'FAILED\|fatal' "$STATE/site-grow.out" | head -40)"
grep -A4 'PLAY RECAP' "$STATE/site-grow.out" | tee -a "$LOG"

step "Ray runs on all three nodes, $NEW included"
ansible-playbook playbooks/ray.yml -i "$STATE/inv-all" -e ray_state=status > "$STATE/ray-all.out" 2>&1 \
    || fail "ray status on three nodes: $(tail -30 "$STATE/ray-all.out")"
grep -q "$NEW" "$STATE/ray-all.out" || fail "ray status does not name $NEW"

for launcher in torchrun deepspeed; do
    step "train.yml $launcher across the three nodes"
    ansible-playbook playbooks/train.yml -i "$STATE/inv-all" -e training_launcher=$launcher \
        -e training_job_id=grow-$launcher -e training_wait=finished -e '{"training_script_args": ["--steps", "5"]}' \
        > "$STATE/train-$launcher.out" 2>&1 || fail "train $launcher: $(grep -A12 'FAILED\|fatal' "$STATE/train-$launcher.out" | head -40)"
    grep -q 'world 4' "$STATE/train-$launcher.out" || fail "train $launcher: no 'world 4' in the output"
done

for n in $(seq 1 "$BACK_TO_BACK"); do
    step "deepspeed job $n of $BACK_TO_BACK, started right after the previous one ended"
    ansible-playbook playbooks/train.yml -i "$STATE/inv-all" -e training_launcher=deepspeed \
        -e training_job_id=grow-b2b-$n -e training_wait=finished -e '{"training_script_args": ["--steps", "2"]}' \
        > "$STATE/b2b-$n.out" 2>&1 || fail "back-to-back job $n refused or failed: $(grep -A12 'FAILED\|fatal' "$STATE/b2b-$n.out" | head -40)"
done
finish 0

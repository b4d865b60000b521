#!/usr/bin/env bash
# What the collection's runs cost as the cluster grows, on light lab nodes (benchmarks/scale-light.yml: one
# rank a node, one Python environment on the shared storage), one run each at every size of NODES:
#   - site.yml on the bare nodes (timed, not a target), then site.yml again on the converged cluster;
#   - the health quick tier (health.yml);
#   - a supervised job, a step a second: its supervisor's reads (read_seconds in its heartbeat, sampled for
#     READ_SECONDS: median and max), then the rank of the last worker killed: seconds to the glance's sign, to
#     the supervisor's fault event (and the seconds of the quick read that saw it) and to training again.
#     SCALE_JOB=light (the default): mpirun and benchmarks/light_rank.py, a rank with no framework (a few MB),
#     at every size; SCALE_JOB=ddp: torchrun and train_tiny.py --engine ddp, up to SUPERVISE_MAX nodes (each
#     node's agent and rank import torch, about 0.3 GB a node);
#   - PARTS frozen: the same job again, then the last worker frozen (podman pause): seconds to the glance's sign
#     (its ranks late: training_supervise_late_seconds), to the fault event (and the seconds of its quick read)
#     and to training again without it;
# and each figure's ratio to the smallest size. The targets: at 64 nodes a read
# within 3x its 4-node time and a killed rank seen within 30 s; quick health and converged site.yml within 3x.
#   benchmarks/scale.sh                            # NODES="4 16 32 64" PARTS="site health supervise frozen"
#   NODES="4 16" benchmarks/scale.sh
#   NODES="4 64" PARTS="bare health supervise" benchmarks/scale.sh   # bare: site.yml's first run alone
#   NODES=64 KEEP_LAB=1 LAB_AS_IS=1 PARTS=frozen benchmarks/scale.sh  # a frozen node on a kept lab
#   SUPERVISOR_AS_IS=1 ...          # a kept lab whose supervisor host has this tree's collection already (an
#                                   # earlier run put it there): no site.yml --tags supervisor first (12 min at 64)
#   NODES=16 KEEP_LAB=1 PARTS=supervise benchmarks/scale.sh   # again on the lab a run kept (site.yml ran on it)
#   NODES=64 KEEP_LAB=1 LAB_AS_IS=1 benchmarks/scale.sh       # a kept lab of 64 nodes, not made again (its loops
#                                                             # over the nodes take minutes at 64)
#   NODES=32 KEEP_LAB=1 LAB_AS_IS=1 PARTS="converged health supervise" benchmarks/scale.sh
#                                   # a kept lab that site.yml already set up: the converged run alone
# The lab (LAB_NAME, LAB_SUBNET) grows from one size to the next (sizes in rising order: a node the
# last size set up is not set up again by hand, site.yml's first run at the next size does it) and is
# removed at the end unless KEEP_LAB=1; `make lab-down` removes it too. The lab's nodes share this machine's
# cores with the controller and the supervisor: the figures are this machine's, not a cluster's (the
# load average is printed with each). Many nodes need the host's fs.inotify.max_user_instances raised
# (lab.yml says by how much).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
export ANSIBLE_DEPRECATION_WARNINGS=false
# The lab's nodes share this machine's 2 cores with the controller: at 32 or 64 nodes sudo on a node
# may take more than ansible.cfg's 20 s to answer (`Timeout (22s) waiting for privilege escalation prompt`).
# At 64 nodes, the first sudo on 32 nodes at once (forks) took more than 62 s: each starts root's session on
# its node (logind, the user manager), all on the same 2 cores. SITE_ANSIBLE_TIMEOUT bounds site.yml's.
export ANSIBLE_TIMEOUT=${ANSIBLE_TIMEOUT:-60}
SITE_ANSIBLE_TIMEOUT=${SITE_ANSIBLE_TIMEOUT:-240}
# Each run's slowest tasks at the end of its log (what grows with the cluster)
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=${PROFILE_TASKS_TASK_OUTPUT_LIMIT:-25}
NODES=${NODES:-4 16 32 64}
SCALE_JOB=${SCALE_JOB:-light}  # the supervised job: light (mpirun, light_rank.py) or ddp (torchrun, train_tiny.py)
SUPERVISE_MAX=${SUPERVISE_MAX:-32}  # the most nodes of a ddp job (memory); a light job runs at every size
PARTS=${PARTS:-site health supervise frozen}  # what is run at each size (site: both site.yml runs; bare: the first
                                       # alone; converged: the second alone, on a kept lab site.yml set up)
READ_SECONDS=${READ_SECONDS:-90}
# The head's ssh connect bound of the supervised job (training_ssh_connect_timeout; 5 by default): the start's SSH
# check logs in to every node at once, and at 64 nodes on 2 cores sshd's banner came later than 5 s (load 33-38)
SSH_CONNECT_TIMEOUT=${SSH_CONNECT_TIMEOUT:-30}
# The supervisor's own Ansible timeout (supervisor_ssh_timeout, 10 by default; sudo's prompt waits 2 s more), given
# to every site.yml run: at 64 nodes, load 20-30, the start's read as the supervisor will read (sudo to the
# training account on the head) took more than 12 s
SUPERVISOR_SSH_TIMEOUT=${SUPERVISOR_SSH_TIMEOUT:-60}
LAB_NAME=${LAB_NAME:-lab-scale}
LAB_SUBNET=${LAB_SUBNET:-10.213.52.0/24}
LAB_UP_TIMEOUT=${LAB_UP_TIMEOUT:-1800}
SITE_TIMEOUT=${SITE_TIMEOUT:-5400}
INV=inventories/$LAB_NAME
HEAD=lab-head
LOG=${LOG_DIR:-$(mktemp -d /tmp/scale-bench.XXXXXX)}
mkdir -p "$LOG"
RESULTS=$LOG/results.tsv
printf 'nodes\tsite_first\tsite_converged\tsite_changed\tsite_cpu\thealth_quick\thealth_rc\thealth_cpu\tread_median\tread_max\treads\tsign\tseen\tquick\ttraining\tfrozen_sign\tfrozen_seen\tfrozen_quick\tfrozen_training\tload\n' >"$RESULTS"

lab() {
  timeout "$LAB_UP_TIMEOUT" ansible-playbook lab/lab.yml -i lab/controller.yml -e lab_name="$LAB_NAME" \
    -e lab_subnet="$LAB_SUBNET" -e lab_inventory_dir="$INV" \
    -e @benchmarks/scale-light.yml "$@" >>"$LOG/lab.log" 2>&1
}
children_cpu() {  # the CPU seconds (user and system) of this shell's children that ended, so far, in $children
  # (times runs in this shell, not in a pipe's subshell, whose children are not these)
  times >"$LOG/.times"
  children=$(awk 'NR == 2 {s = 0; for (i = 1; i <= 2; i++) {split($i, a, "m"); sub("s", "", a[2]); s += a[1] * 60 + a[2]}
                           printf "%.2f\n", s}' "$LOG/.times")
}
seconds() {  # <cmd...>: runs it; its wall seconds in $elapsed, the controller's CPU seconds in $cpu, its rc in $rc
  local t0 t1 c0
  children_cpu
  c0=$children
  t0=$(date +%s.%N)
  "$@"
  rc=$?
  t1=$(date +%s.%N)
  children_cpu
  elapsed=$(echo "$t1 - $t0" | bc)
  # ansible-playbook, its forks and their ssh clients: the controller's work (the nodes' own work runs in
  # their containers, outside this process tree)
  cpu=$(echo "$children - $c0" | bc)
}
load() { cut -d' ' -f1 /proc/loadavg; }
on_head() { podman exec "$LAB_NAME-$HEAD" "$@"; }
events_of() { on_head cat "/var/lib/gpucluster/supervise/$1/events.jsonl" 2>/dev/null; }
changed_of() {  # the sum of changed= over the play recap of a log
  awk '/PLAY RECAP/{r=1} r && /changed=/{for(i=1;i<=NF;i++) if($i ~ /^changed=/){split($i,a,"="); s+=a[2]}} END{print s+0}' "$1"
}

start_job() {  # N JOB: start a supervised job of the kind SCALE_JOB says on the lab; waits for its supervisor
  local n=$1 job=$2 i job_vars=()
  if [ "$SCALE_JOB" = light ]; then
    # a user's script on the shared storage: light_rank.py and the progress helper it imports, beside it
    mkdir -p "$LOG/light" && cp benchmarks/light_rank.py roles/training/files/gpucluster_progress.py "$LOG/light/"
    ansible "$HEAD" -i "$INV" -b -m ansible.builtin.copy \
      -a "src=$LOG/light/ dest=/shared/bench/ mode=0644 directory_mode=0755" >"$LOG/light-$n.log" 2>&1 \
      || echo "  light_rank.py could not be put on the shared storage: $LOG/light-$n.log" >&2
    job_vars=(-e training_launcher=mpirun -e training_script=/shared/bench/light_rank.py
              -e '{"training_script_args": ["--steps", "100000", "--step-delay", "1"]}')
  else
    # DDP (torch alone: no DeepSpeed op to build on nodes without compilers, less memory a rank), no
    # checkpoint: the restart starts from step 0, and says so
    job_vars=(-e '{"training_script_args": ["--engine", "ddp", "--steps", "100000", "--step-delay", "1"]}')
  fi
  if ! ansible-playbook playbooks/train.yml -i "$INV" -e training_job_id="$job" -e training_supervise=true \
      -e training_restarts=1 -e training_wait_timeout=900 -e training_ssh_connect_timeout="$SSH_CONNECT_TIMEOUT" \
      "${job_vars[@]}" \
      >"$LOG/train-$job.log" 2>&1; then
    echo "  the supervised job did not start: $LOG/train-$job.log" >&2; return 1
  fi
  for i in $(seq 1 300); do events_of "$job" | grep -q '"event": "supervising"' && break; sleep 2; done
}
recovered() {  # JOB EVENTS: wait (15 min at most) for the supervisor's training or gave_up event; save its events
  local i
  for i in $(seq 1 450); do events_of "$1" | grep -q '"event": "\(training\|gave_up\)"' && break; sleep 2; done
  events_of "$1" >"$2"
}

stop_job() {  # JOB LOG: stop the job (train.yml training_state=stopped), its output in LOG
  ansible-playbook playbooks/train.yml -i "$INV" -e training_state=stopped -e training_job_id="$1" \
    >"$2" 2>&1 || echo "  the job's stop failed: $2" >&2
}

fault_figures() {  # EVENTS T0: "sign seen quick training" of the first fault after T0 and the training after it
  python3 - "$1" "$2" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = float(sys.argv[2])
first = lambda kind: next((e for e in events if e['event'] == kind and e['time'] >= t0), None)
fault, again = first('fault'), first('training')
figure = lambda value: '-' if value is None else '%.1f' % value
print('%s %s %s %s' % (figure(fault['sign_time'] - t0 if fault and fault.get('sign_time') else None),
                       figure(fault['time'] - t0 if fault else None), figure(fault.get('quick_seconds') if fault else None),
                       figure(again['time'] - t0 if again else None)))
PY
}

supervised() {  # N: start a supervised job, sample its reads, kill a rank; prints "median max count sign seen quick
                #    training" (quick: the seconds of the quick read that saw the fault, - when a whole read did)
  local n=$1 job=scale-$1-$$ worker rank pid fault i
  worker=lab-worker-$((n - 1))
  if ! start_job "$n" "$job"; then echo "- - 0 - - - -"; return; fi
  # the supervisor's own figure of each read: read_seconds of its heartbeat, one per last_read
  for i in $(seq 1 $((READ_SECONDS / 2))); do
    on_head cat "/var/lib/gpucluster/supervise/$job/supervisor.json" 2>/dev/null; echo
    sleep 2
  done >"$LOG/heartbeats-$n.jsonl"
  rank=$(on_head grep -l "host=$worker " -r "/shared/jobs/$job/progress/" | head -1)
  pid=$(on_head head -1 "$rank" | sed -n 's/.* pid=\([0-9]*\).*/\1/p')
  fault=$(date +%s.%N)
  podman exec --user train "$LAB_NAME-$worker" kill -9 "$pid"
  recovered "$job" "$LOG/events-$n.jsonl"
  stop_job "$job" "$LOG/stop-$n.log"
  echo "$(python3 - "$LOG/heartbeats-$n.jsonl" <<'PY'
import json, statistics, sys
reads = {}
for line in open(sys.argv[1]):
    try:
        beat = json.loads(line)
    except ValueError:
        continue
    if beat.get('last_read') and beat.get('read_seconds') is not None:
        reads[beat['last_read']] = beat['read_seconds']
values = sorted(reads.values())
figure = lambda value: '-' if value is None else '%.1f' % value
print('%s %s %d' % (figure(statistics.median(values) if values else None), figure(values[-1] if values else None),
                    len(values)))
PY
) $(fault_figures "$LOG/events-$n.jsonl" "$fault")"
}

frozen() {  # N: start a supervised job, freeze the last worker (podman pause); prints "sign seen quick training"
  local n=$1 job=scale-frozen-$1-$$ worker t0 i
  worker=lab-worker-$((n - 1))
  if ! start_job "$n" "$job"; then echo "- - - -"; return; fi
  sleep 20  # a few steps: each rank's pace is in its progress file
  t0=$(date +%s.%N)
  podman pause "$LAB_NAME-$worker" >/dev/null
  recovered "$job" "$LOG/events-frozen-$n.jsonl"
  podman unpause "$LAB_NAME-$worker" >/dev/null
  stop_job "$job" "$LOG/stop-frozen-$n.log"
  fault_figures "$LOG/events-frozen-$n.jsonl" "$t0"
}

for n in $NODES; do
  echo "=== $n node(s), $(date -u +%FT%TZ), load $(load): lab up (log $LOG/lab.log)"
  if [ -n "${LAB_AS_IS:-}" ]; then
    echo "  LAB_AS_IS: the kept lab and its inventory $INV as they are (a lab of $n node(s) made by an earlier run)"
  elif ! lab -e lab_nodes="$n"; then
    echo "the lab of $n node(s) could not be made; stopping here (see $LOG/lab.log):"
    grep -o 'lab [^"]*Nothing was started\.\|lab: [^"]*' "$LOG/lab.log" | tail -1
    break
  fi
  first=0 again=0 changed=- health=0 health_rc=- site_cpu=- health_cpu=-
  if [[ " $PARTS " == *" site "* || " $PARTS " == *" converged "* || " $PARTS " == *" bare "* ]]; then
    if [[ " $PARTS " == *" site "* || " $PARTS " == *" bare "* ]]; then
      seconds timeout "$SITE_TIMEOUT" env ANSIBLE_TIMEOUT="$SITE_ANSIBLE_TIMEOUT" ansible-playbook playbooks/site.yml \
        -i "$INV" -e supervisor_ssh_timeout="$SUPERVISOR_SSH_TIMEOUT" >"$LOG/site-first-$n.log" 2>&1
      first=$elapsed
      if [ "$rc" -ne 0 ]; then echo "site.yml failed on $n node(s) (rc $rc): $LOG/site-first-$n.log"; break; fi
    fi
    if [[ " $PARTS " != *" bare "* ]]; then
      seconds timeout "$SITE_TIMEOUT" env ANSIBLE_TIMEOUT="$SITE_ANSIBLE_TIMEOUT" ansible-playbook playbooks/site.yml \
        -i "$INV" -e supervisor_ssh_timeout="$SUPERVISOR_SSH_TIMEOUT" >"$LOG/site-again-$n.log" 2>&1
      again=$elapsed site_cpu=$cpu
      changed=$(changed_of "$LOG/site-again-$n.log")
      [ "$rc" -eq 0 ] || echo "  the converged site.yml failed (rc $rc): $LOG/site-again-$n.log"
    fi
  fi
  if [[ " $PARTS " == *" health "* ]]; then
    seconds ansible-playbook playbooks/health.yml -i "$INV" -e health_report_dir=/var/lib/gpucluster/health-scale \
      >"$LOG/health-$n.log" 2>&1
    health=$elapsed health_rc=$rc health_cpu=$cpu
  fi
  if [[ (" $PARTS " == *" supervise "* || " $PARTS " == *" frozen "*) && " $PARTS " != *" site "* \
        && " $PARTS " != *" converged "* && " $PARTS " != *" bare "* && -z "${SUPERVISOR_AS_IS:-}" ]]; then
    # a kept lab, set up by an earlier run: its supervisor host gets this tree's copy of the collection
    # (a supervised start refuses a supervisor host that runs another); site.yml's timeout: the first sudo on
    # every node of a lab started again (as after a reboot) took more than 62 s at 64 nodes
    env ANSIBLE_TIMEOUT="$SITE_ANSIBLE_TIMEOUT" ansible-playbook playbooks/site.yml -i "$INV" --tags supervisor \
      -e supervisor_ssh_timeout="$SUPERVISOR_SSH_TIMEOUT" >"$LOG/supervisor-$n.log" 2>&1 \
      || echo "  site.yml --tags supervisor failed: $LOG/supervisor-$n.log" >&2
  fi
  if [[ " $PARTS " != *" supervise "* ]]; then
    med=- max=- count=0 sign=- seen=- quick=- training=-
  elif [ "$SCALE_JOB" = light ] || [ "$n" -le "$SUPERVISE_MAX" ]; then
    read -r med max count sign seen quick training < <(supervised "$n")
  else
    med=- max=- count=0 sign=- seen=- quick=- training=-
    echo "  no ddp job above SUPERVISE_MAX=$SUPERVISE_MAX nodes (memory: a torchrun agent and a rank a node;" \
         "SCALE_JOB=light runs at every size)"
  fi
  fsign=- fseen=- fquick=- ftraining=-
  if [[ " $PARTS " == *" frozen "* ]] && { [ "$SCALE_JOB" = light ] || [ "$n" -le "$SUPERVISE_MAX" ]; }; then
    read -r fsign fseen fquick ftraining < <(frozen "$n")
  fi
  printf '%s\t%.0f\t%.0f\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$first" \
    "$again" "$changed" "$site_cpu" "$health" "$health_rc" "$health_cpu" "$med" "$max" "$count" "$sign" "$seen" "$quick" \
    "$training" "$fsign" "$fseen" "$fquick" "$ftraining" "$(load)" >>"$RESULTS"
  printf '%3d node(s): site.yml %.0f s bare, %.0f s converged (%s changed, controller CPU %s s); health quick %.0f s (rc %s, controller CPU %s s); supervisor read median %s s, max %s s (%s reads); killed rank: glance sign %s s, fault %s s (quick read %s s), training again %s s; frozen node: glance sign %s s, fault %s s (quick read %s s), training again %s s; load %s\n' \
    "$n" "$first" "$again" "$changed" "$site_cpu" "$health" "$health_rc" "$health_cpu" "$med" "$max" "$count" "$sign" \
    "$seen" "$quick" "$training" "$fsign" "$fseen" "$fquick" "$ftraining" "$(load)"
done
[ -n "${KEEP_LAB:-}" ] || lab -e lab_state=absent
python3 - "$RESULTS" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
if len(rows) < 2:
    sys.exit(0)
base = rows[0]
print('ratio to %s nodes (targets at 64: read, health quick and converged site.yml within 3x; a killed rank seen '
      'within 30 s):' % base['nodes'])
for row in rows[1:]:
    def ratio(key):
        try:
            return '%.2f' % (float(row[key]) / float(base[key]))
        except (ValueError, ZeroDivisionError):
            return '-'
    print('  %3s node(s): site.yml converged %s (controller CPU %s), health quick %s (controller CPU %s), supervisor '
          'read (median) %s, killed rank seen %s s, frozen node seen %s s'
          % (row['nodes'], ratio('site_converged'), ratio('site_cpu'), ratio('health_quick'), ratio('health_cpu'),
             ratio('read_median'), row['seen'], row['frozen_seen']))
PY
echo "logs and results.tsv: $LOG"

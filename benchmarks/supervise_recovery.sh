#!/usr/bin/env bash
# Seconds from a fault to the supervised job's next step, and steps lost against the checkpoint
# interval: a supervised DeepSpeed job (train_tiny.py, --save-every SAVE_EVERY) whose rank on WORKER
# is killed ROUNDS times, once per job; each round reads the job's events on the supervisor host (the head).
# FAULT=freeze freezes WORKER's container instead (podman pause, a lab node on this machine: the node
# stops answering, as a hung kernel would), and unfreezes it once the job trains again.
#   benchmarks/supervise_recovery.sh     # INV=lab/inventory WORKER=<a worker> ROUNDS=3 SAVE_EVERY=5 FAULT=kill
# On a cluster site.yml set up (its supervisor step prepares the head); more -e options in EXTRA.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-lab/inventory}
JOBS_DIR=${JOBS_DIR:-/shared/jobs}  # training_jobs_dir
export ANSIBLE_DEPRECATION_WARNINGS=false
ROUNDS=${ROUNDS:-3}
SAVE_EVERY=${SAVE_EVERY:-5}
WORKER=${WORKER:?name the worker whose rank is killed (WORKER=...)}
FAULT=${FAULT:-kill}
case "$FAULT" in
  kill) ;;
  freeze) CONTAINER=${CONTAINER:-$(podman ps --format '{{.Names}}' | grep -- "-$WORKER\$" | head -1)}
          [ -n "$CONTAINER" ] || { echo "no container of $WORKER on this machine (CONTAINER=...)" >&2; exit 2; } ;;
  *) echo "FAULT must be kill or freeze, got $FAULT" >&2; exit 2 ;;
esac
HEAD=$(ansible-inventory -i "$INV" --graph head | sed -n 's/.*--//p' | head -1)
read -r -a extra <<< "${EXTRA:-}"
# a command's output on one node, its lines as they are (the first line of ansible's answer is the host's)
on() { ansible -i "$INV" "$1" -b --become-user "${TRAIN_USER:-train}" -m ansible.builtin.command -a "$2" 2>/dev/null \
         | sed '1d'; }
# the supervisor's events of a job, root's on the supervisor host
events_of() { ansible -i "$INV" "$HEAD" -b -m ansible.builtin.command -a "cat /var/lib/gpucluster/supervise/$1/events.jsonl" \
                2>/dev/null | sed '1d'; }

to_seen=(); to_step=(); lost=()
for round in $(seq 1 "$ROUNDS"); do
  job=bench-sup-$$-$round
  ckpt=$JOBS_DIR/$job/checkpoints  # the job directory: the training account writes there
  ansible-playbook playbooks/train.yml -i "$INV" -e training_job_id="$job" -e training_supervise=true \
    -e training_restarts=1 -e '{"training_env": {"DS_ACCELERATOR": "cpu"}}' "${extra[@]}" \
    -e "{\"training_script_args\": [\"--steps\", \"100000\", \"--save-every\", \"$SAVE_EVERY\", \"--step-delay\", \"0.2\",
         \"--checkpoint-dir\", \"$ckpt\"]}" >/dev/null
  # a fault at a random point between two checkpoints, after two of them
  for _ in $(seq 1 300); do
    [ "$(on "$HEAD" "cat $ckpt/latest" | tr -dc 0-9)" -ge $((2 * SAVE_EVERY)) ] 2>/dev/null && break
    sleep 2
  done
  sleep "$(python3 -c "import random; print(round(random.uniform(0, $SAVE_EVERY * 0.5), 1))")"
  rank=$(on "$HEAD" "grep -l host=$WORKER $JOBS_DIR/$job/progress/ -r" | head -1)
  pid=$(on "$HEAD" "head -1 $rank" | sed -n 's/.* pid=\([0-9]*\).*/\1/p')
  fault=$(date +%s.%N)
  if [ "$FAULT" = freeze ]; then podman pause "$CONTAINER" >/dev/null; else on "$WORKER" "kill -9 $pid" >/dev/null; fi
  for _ in $(seq 1 300); do
    events_of "$job" | grep -q '"event": "\(training\|gave_up\)"' && break
    sleep 2
  done
  [ "$FAULT" = freeze ] && podman unpause "$CONTAINER" >/dev/null
  events=$(events_of "$job")
  read -r seen secs steps < <(EVENTS=$events python3 - "$fault" <<'PY'
import json, os, sys
events = [json.loads(l) for l in os.environ['EVENTS'].splitlines() if l.strip()]
again = [e for e in events if e['event'] == 'training']
restart = [e for e in events if e['event'] == 'restart']
fault = [e for e in events if e['event'] == 'fault']
t0 = float(sys.argv[1])
print('%.1f %.1f %s' % ((fault[0]['time'] - t0) if fault else -1, (again[0]['time'] - t0) if again else -1,
                        restart[0]['lost_steps'] if restart else -1))
PY
)
  echo "round $round ($FAULT $WORKER): fault seen ${seen} s and training again ${secs} s after it, ${steps} step(s) lost (checkpoint every $SAVE_EVERY)"
  to_seen+=("$seen"); to_step+=("$secs"); lost+=("$steps")
  ansible-playbook playbooks/train.yml -i "$INV" -e training_state=stopped -e training_job_id="$job" >/dev/null || true
done
print_series 'fault seen by the supervisor (s): ' 1 "${to_seen[*]}"
print_series 'fault to next step (s):           ' 1 "${to_step[*]}"
print_series "steps lost (interval $SAVE_EVERY):          " 0 "${lost[*]}"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

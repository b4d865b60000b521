#!/usr/bin/env bash
# torchrun's own in-place restart (training_torchrun_max_restarts): seconds from a rank killed on WORKER
# to the job's next step, and the steps lost against the checkpoint interval, ROUNDS times (one job a
# round; DeepSpeed ZeRO through torchrun, train_tiny.py, --save-every SAVE_EVERY). No supervisor: the
# agents restart every node's ranks on the same nodes, and the example resumes from its checkpoint.
#   INV=lab/inventory WORKER=<a worker> ROUNDS=3 SAVE_EVERY=5 benchmarks/torchrun_inplace_restart.sh
# It prints figures; it is not a test (nothing fails on a slow figure). A round whose job did not
# come back says so and counts no figure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-lab/inventory}
ROUNDS=${ROUNDS:-3}
SAVE_EVERY=${SAVE_EVERY:-5}
WAIT=${WAIT:-300}
WORKER=${WORKER:?name the worker whose rank is killed (WORKER=...)}
HEAD=$(ansible-inventory -i "$INV" --graph head | sed -n 's/.*--//p' | head -1)
on() { ansible -i "$INV" "$1" -b --become-user "${TRAIN_USER:-train}" -m ansible.builtin.command -a "$2" -o \
         | sed -n 's/.*(stdout) //p'; }
play() { ansible-playbook playbooks/train.yml -i "$INV" -e training_launcher=torchrun "$@"; }

to_step=(); lost=()
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  job=bench-inplace-$$-$round
  ckpt=/shared/ckpt/$job
  progress=/shared/jobs/$job/progress
  play -e training_job_id="$job" -e training_torchrun_max_restarts=2 -e training_wait=first_step \
    -e training_env='{"DS_ACCELERATOR": "cpu"}' \
    -e "{\"training_script_args\": [\"--steps\", \"100000\", \"--save-every\", \"$SAVE_EVERY\", \"--step-delay\", \"0.2\",
         \"--checkpoint-dir\", \"$ckpt\"]}" >/dev/null
  until [ "$(on "$HEAD" "cat $ckpt/latest" | tr -dc 0-9)" -ge $((2 * SAVE_EVERY)) ] 2>/dev/null; do sleep 2; done
  # a fault at a random point between two checkpoints
  sleep "$(python3 -c "import random; print(round(random.uniform(0, $SAVE_EVERY * 0.5), 1))")"
  rank=$(on "$HEAD" "grep -l host=$WORKER $progress -r" | head -1)
  pid=$(on "$HEAD" "head -1 $rank" | sed -n 's/.* pid=\([0-9]*\).*/\1/p')
  head_pid=$(on "$HEAD" "head -1 $progress/rank-0.log" | sed -n 's/.* pid=\([0-9]*\).*/\1/p')
  fault=$(date +%s.%N)
  on "$WORKER" "kill -9 $pid" >/dev/null
  before=$(on "$HEAD" "cat $progress/rank-0.log" | sed -n 's/^step=\([0-9]*\) .*/\1/p' | tail -1)
  # rank 0 starts its progress file again (another pid) when torchrun restarted it; then its first step
  secs=-1; steps=-1
  for _ in $(seq 1 $((WAIT / 2))); do
    text=$(on "$HEAD" "cat $progress/rank-0.log" || true)
    if ! grep -q "pid=$head_pid " <<< "$text" && grep -q '^step=' <<< "$text"; then
      read -r secs steps < <(python3 - "$fault" "${before:-0}" <<< "$text" <<'PY'
import re, sys
first = next(re.finditer(r'^step=(\d+) .*time=([0-9.]+)', sys.stdin.read(), re.M))
print('%.1f %d' % (float(first.group(2)) - float(sys.argv[1]), int(sys.argv[2]) - (int(first.group(1)) - 1)))
PY
)
      break
    fi
    sleep 2
  done
  status=$(play -e training_state=status -e training_job_id="$job" 2>/dev/null | grep -o 'torchrun restarted the ranks in place[^"]*' | head -1 || true)
  if [ "$secs" = -1 ]; then
    echo "round $round: the job did not step again within ${WAIT} s of the kill"
  else
    echo "round $round: training again ${secs} s after the kill, ${steps} step(s) lost (checkpoint every $SAVE_EVERY); ${status:-no restart line in status}"
    to_step+=("$secs"); lost+=("$steps")
  fi
  play -e training_state=stopped -e training_job_id="$job" >/dev/null || true
done
[ ${#to_step[@]} -gt 0 ] || { echo "no round came back"; exit 1; }
print_series 'kill to next step (s):         ' 1 "${to_step[*]}"
print_series "steps lost (interval $SAVE_EVERY):      " 0 "${lost[*]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

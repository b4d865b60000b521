#!/usr/bin/env bash
# Time from `ansible-playbook playbooks/train.yml` to the first logged step, against the same
# deepspeed command typed by hand on the head, on the same lab in the same run.
#   make lab && benchmarks/train_startup.sh            # ENV_PATH=/opt/gpucluster/env ROUNDS=3
# Prints each time and the ratio (playbook / by hand). Both paths use the same hostfile,
# DS_ENV_FILE, script and warm JIT cache (a warm-up job runs first).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-lab/inventory}
ENV_PATH=${ENV_PATH:-/opt/gpucluster/env}
ROUNDS=${ROUNDS:-3}
key=$(sed -n 's/^ *ansible_ssh_private_key_file: //p' "$INV/hosts.yml")
opts=$(sed -n '/ansible_ssh_common_args/,/IdentitiesOnly/p' "$INV/hosts.yml" | grep -o -- '-o [^ ]*' | tr '\n' ' ')
head_ip=$(ansible-inventory -i "$INV" --host "$(ansible-inventory -i "$INV" --graph head | sed -n 's/.*--//p' | head -1)" \
          | python3 -c 'import json,sys; print(json.load(sys.stdin)["ansible_host"])')
user=$(sed -n 's/^ *ansible_user: //p' "$INV/hosts.yml")
on_head() { ssh -i "$key" $opts "$user@$head_ip" "$@"; }
play() {
  ansible-playbook playbooks/train.yml -i "$INV" -e training_env_path="$ENV_PATH" "$@" >/dev/null
}
stop() { play -e training_state=stopped -e training_job_id="$1" -e training_wait=none || true; }

echo "warm-up (JIT builds of DeepSpeed's CPU ops; over 20 minutes on a busy 2-core machine)"
play -e training_job_id=bench-warm-$$ -e training_wait=finished -e training_wait_timeout="${WARMUP_TIMEOUT:-3600}" \
  -e '{"training_script_args": ["--steps", "3"]}'

pb=(); hand=()
for i in $(seq "$ROUNDS"); do
  id=bench-pb-$i-$$
  t0=$(date +%s.%N)
  play -e training_job_id="$id" -e training_wait=first_step -e '{"training_script_args": ["--steps", "1000", "--step-delay", "0.2"]}'
  t1=$(date +%s.%N)
  stop "$id"
  pb+=("$(echo "$t1 - $t0" | bc)")

  # By hand: the launcher line train.yml recorded for the warm-up job, typed on the head.
  jd=/shared/jobs/bench-warm-$$
  t0=$(date +%s.%N)
  on_head "sudo -u train -H bash -c 'cd $jd && export DS_ACCELERATOR=cpu DS_ENV_FILE=$jd/deepspeed_env \
     PATH=$ENV_PATH/bin:\$PATH && exec deepspeed --hostfile $jd/hostfile --launcher pdsh \
     /shared/jobs/train_tiny.py --steps 1000 --step-delay 0.2' 2>&1 | grep -m1 -E 'step [0-9]+ loss'" >/dev/null || true
  t1=$(date +%s.%N)
  on_head "sudo -u train pdsh -w \$(cut -d' ' -f1 $jd/hostfile | paste -sd,) 'pkill -u train -f train_tiny.py'" >/dev/null 2>&1 || true
  hand+=("$(echo "$t1 - $t0" | bc)")
  sleep 3
done
print_series 'train.yml to first step (s):   ' 1 "${pb[*]}"
print_series 'by hand to first step (s):     ' 1 "${hand[*]}"
print_median_ratio 'ratio train.yml / by hand:     ' "${pb[*]}" "${hand[*]}" ' (goal < 1.2)'

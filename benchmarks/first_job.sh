#!/usr/bin/env bash
# Start to first logged step of the first DeepSpeed job on a lab fresh from site.yml, against the
# jobs after it, on the same lab in the same run (goal: within 1.5x).
#   make lab && ansible-playbook playbooks/site.yml -i lab/inventory && benchmarks/first_job.sh
#   INV=inventories/lab-x ROUNDS=3 benchmarks/first_job.sh
# The first job is timed only once per lab: run the script right after site.yml. COLD=1 first
# empties the training account's torch extension cache on every node (as before python_env built
# the ops), so the first job JIT-builds them: the figure the prebuild saves.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-lab/inventory}
ROUNDS=${ROUNDS:-3}
COLD=${COLD:-0}
TRAIN_USER=${TRAIN_USER:-train}
play() { ansible-playbook playbooks/train.yml -i "$INV" "$@"; }
stop() { play -e training_state=stopped -e training_job_id="$1" -e training_wait=none >/dev/null || true; }
load() { printf '%s (%s cores)' "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)"; }
# time_job ID: seconds from `ansible-playbook train.yml` to the head's first logged step; stops the job
time_job() {
  local t0 t1 out
  out=$(mktemp)
  t0=$(date +%s.%N)
  play -e training_job_id="$1" -e training_wait=first_step \
       -e '{"training_script_args": ["--steps", "1000", "--step-delay", "0.2"]}' >"$out"
  t1=$(date +%s.%N)
  grep -o 'host [^:]*: [^"]*DeepSpeed op[^"]*' "$out" | sed 's/^/  preflight: /' >&2 || true
  rm -f "$out"
  stop "$1"
  echo "$t1 - $t0" | bc
}

if [ "$COLD" = 1 ]; then
  echo "COLD=1: emptying the torch extension cache of $TRAIN_USER on every node"
  ansible cluster -i "$INV" -b -m ansible.builtin.shell \
    -a "rm -rf ~$TRAIN_USER/.cache/torch_extensions" >/dev/null
fi
echo "load before:   $(load)"
first=$(time_job "bench-first-$$")
echo "load after the first job: $(load)"
later=()
for i in $(seq "$ROUNDS"); do
  later+=("$(time_job "bench-next-$i-$$")")
  sleep 3
done
echo "load after:    $(load)"
print_series 'first job to first step (s):  ' 1 "$first"
print_series 'later jobs to first step (s): ' 1 "${later[*]}"
print_median_ratio 'ratio first / later:          ' "$first" "${later[*]}" ' (goal <= 1.5)'

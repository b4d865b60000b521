#!/usr/bin/env bash
# Time to the first logged step of a DeepSpeed job in containers against the same job on the hosts,
# on one lab in one run: the first container job right after the image was loaded again on every
# node (no container has run from it yet), then warm container jobs against warm host jobs
# (goals: the first container job within 1.5x of the first host job, a warm one within 1.2x of a
# warm host job; before the image carried DeepSpeed's ops the first took 167.5 s against 13-14 s).
#   a lab with both: python_env on the hosts and the container step (cluster_container_runtime=podman)
#   INV=.lab/inv ROUNDS=3 benchmarks/container_first_step.sh
# EXTRA: more -e of the site (both site.yml and train.yml get them), e.g. a container lab's
#   EXTRA='-e container_storage_driver=vfs -e container_cgroups=disabled -e container_memlock_unlimited=false
#          -e training_container_memlock=false -e container_base_image=localhost/gpucluster-base:bookworm
#          -e container_base_archive=/shared/images/gpucluster-base.oci.tar -e container_wheelhouse=/opt/wheelhouse'
# It prints figures and ratios; it is not a test (nothing fails on a slow figure).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-lab/inventory}
ROUNDS=${ROUNDS:-3}
TRAIN_USER=${TRAIN_USER:-train}
RUNTIME=${RUNTIME:-podman}
IMAGE=${IMAGE:-}
read -r -a extra <<< "${EXTRA:-}"
export ANSIBLE_DEPRECATION_WARNINGS=false
# the lab's nodes run no GPU: DeepSpeed on the CPU builds the shm op (python_env and the image prebuild it)
ARGS='{"training_script_args": ["--steps", "1000", "--step-delay", "0.2"], "training_env": {"DS_ACCELERATOR": "cpu"}}'
play() { ansible-playbook playbooks/train.yml -i "$INV" -e training_launcher=deepspeed "${extra[@]}" "$@"; }
stop() { play -e training_state=stopped -e training_job_id="$1" -e training_wait=none "${@:2}" >/dev/null || true; }
load() { printf '%s (%s cores)' "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)"; }
# time_job ID RUNTIME: seconds from `ansible-playbook train.yml` to the head's first logged step; stops the job
time_job() {
  local t0 t1 out
  out=$(mktemp)
  t0=$(date +%s.%N)
  play -e training_job_id="$1" -e training_container_runtime="$2" -e training_wait=first_step -e "$ARGS" >"$out" \
    || { tail -30 "$out" >&2; exit 1; }
  t1=$(date +%s.%N)
  grep -o '\(host [^:]*: \)\?[^"]*DeepSpeed op[^"]*' "$out" | sed "s/^/  $2 preflight: /" >&2 || true
  rm -f "$out"
  stop "$1" -e training_container_runtime="$2"
  echo "$t1 - $t0" | bc
}

image_flag=()
[ -n "$IMAGE" ] && image_flag=(-e "cluster_container_image=$IMAGE")
echo "load before:   $(load)"
echo "removing the training image from every node, then loading it again (site.yml --tags container)"
ansible cluster -i "$INV" -b --become-user "$TRAIN_USER" -m ansible.builtin.shell \
  -a "podman ps --all --quiet --filter label=gpucluster.job | xargs -r podman rm --force >/dev/null; \
      podman rmi --force ${IMAGE:-\$(podman images --quiet --filter label=org.opencontainers.image.title=gpucluster-train)} >/dev/null || true" >/dev/null
site_log=$(mktemp)
ansible-playbook playbooks/site.yml -i "$INV" --tags container -e cluster_container_runtime="$RUNTIME" "${extra[@]}" \
  "${image_flag[@]}" >"$site_log" || { tail -30 "$site_log"; exit 1; }
rm -f "$site_log"
echo "load after the load: $(load)"
host_first=$(time_job "bench-ctr-host-first-$$" none)
ctr_first=$(time_job "bench-ctr-first-$$" "$RUNTIME")
host=()
ctr=()
for i in $(seq "$ROUNDS"); do
  host+=("$(time_job "bench-ctr-host-$i-$$" none)")
  sleep 3
  ctr+=("$(time_job "bench-ctr-warm-$i-$$" "$RUNTIME")")
  sleep 3
done
echo "load after:    $(load)"
print_series 'host, first job to first step (s):          ' 1 "$host_first"
print_series 'container, first job after the load (s):    ' 1 "$ctr_first"
print_series 'host, later jobs to first step (s):         ' 1 "${host[*]}"
print_series 'container, later jobs to first step (s):    ' 1 "${ctr[*]}"
print_median_ratio 'ratio first container / first host:         ' "$ctr_first" "$host_first" ' (goal <= 1.5; 167.5 / 13.5 before)'
print_median_ratio 'ratio warm container / warm host:           ' "${ctr[*]}" "${host[*]}" ' (goal <= 1.2)'

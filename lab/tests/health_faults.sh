#!/usr/bin/env bash
# Fault injection on a running lab: plant one fault at a time on one node, run the health
# playbook, check that the report names that node with the expected status and remedy, then
# remove the fault. Starts and ends with a healthy run (no failure, exit code 0).
#
#   ansible-playbook lab/lab.yml -e lab_name=lab-health -e lab_subnet=10.213.50.0/24 \
#       -e lab_inventory_dir=inventories/lab-health -e lab_nodes=4
#   ansible-playbook playbooks/site.yml -i inventories/lab-health   (python_env and nccl_env at least)
#   lab/tests/health_faults.sh                         # every fault
#   lab/tests/health_faults.sh torch clock             # only these
#
# Settings (environment): HEALTH_LAB_NAME (lab-health), HEALTH_LAB_INVENTORY
# (inventories/<name>), HEALTH_FAULT_NODE (the last worker), HEALTH_FAULT_LOG_DIR (a new temp dir).
# Faults: sshd frozen hung_mount torch port shared hosts nccl_iface clock link slurm (frozen:
# the node paused, the run must end within 120 s naming it; link runs the deep tier's
# bandwidth matrix: minutes; slurm, health_slurm_drain, needs playbooks/slurm.yml applied to
# the lab and is skipped otherwise). How each is planted is printed as it is planted.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

LAB=${HEALTH_LAB_NAME:-lab-health}
INV=${HEALTH_LAB_INVENTORY:-inventories/$LAB}
OUT=${HEALTH_FAULT_LOG_DIR:-$(mktemp -d /tmp/health-faults.XXXXXX)}
ALL_FAULTS="sshd frozen hung_mount torch port shared hosts nccl_iface clock link slurm"
FAULTS=${*:-$ALL_FAULTS}
mkdir -p "$OUT"

# Node names, addresses and the master port from the lab's inventory.
eval "$(python3 - "$INV/hosts.yml" <<'PY'
import sys, yaml
inv = yaml.safe_load(open(sys.argv[1]))['all']
kids = inv['children']['cluster']['children']
head = list(kids['head']['hosts'])[0]
workers = list((kids['workers'].get('hosts') or {}))
addr = dict((h, v['ansible_host']) for g in ('head', 'workers') for h, v in (kids[g].get('hosts') or {}).items())
print('HEAD=%s; HEAD_ADDR=%s; LAST_WORKER=%s' % (head, addr[head], workers[-1]))
print('declare -A ADDR=(%s)' % ' '.join('[%s]=%s' % kv for kv in addr.items()))
PY
)"
NODE=${HEALTH_FAULT_NODE:-$LAST_WORKER}
PORT=$(python3 -c "import yaml,sys; print((yaml.safe_load(open('$INV/hosts.yml')) or {}).get('all', {}).get('vars', {}).get('cluster_master_port', 29500))" 2>/dev/null || echo 29500)
SITE=/opt/gpucluster/env/lib/python3.11/site-packages

cx() { podman exec "$LAB-$1" bash -c "$2"; }
cpid() { podman inspect -f '{{.State.Pid}}' "$LAB-$1"; }

passed=0; failed=0; results=()
run_health() {  # label, extra ansible-playbook args...
  local label=$1; shift
  local cp; cp=$(mktemp -d /tmp/health-cp.XXXXXX)   # fresh SSH masters: no session outlives a fault
  local start=$SECONDS
  ANSIBLE_SSH_CONTROL_PATH_DIR=$cp ansible-playbook playbooks/health.yml -i "$INV" \
    -e "health_local_report_dir=$OUT/$label" -e "health_raw_dir=$OUT/$label/raw" "$@" >"$OUT/$label.log" 2>&1
  echo $? >"$OUT/$label.rc"
  rm -rf "$cp"
  echo "    ($label: health run took $((SECONDS - start)) s, exit $(cat "$OUT/$label.rc"), log $OUT/$label.log)"
}
expect() {  # label tier args-for-health_expect...
  local label=$1 tier=$2; shift 2
  if python3 lab/tests/health_expect.py "$OUT/$label/latest-$tier.json" "$(cat "$OUT/$label.rc")" "$@"; then
    passed=$((passed + 1)); results+=("ok    $label")
  else
    failed=$((failed + 1)); results+=("FAIL  $label"); grep -E '^ *- .(FAIL|WARN)|remedy' "$OUT/$label.log" | head -20
  fi
}

echo "=== lab $LAB, head $HEAD ($HEAD_ADDR), faults planted on $NODE (${ADDR[$NODE]}), logs in $OUT"
echo "=== healthy: no failure"
run_health healthy-before
expect healthy-before quick healthy

plant_torch() {
  echo "    plant: in $NODE's env, torch's installed distribution renamed to version 2.12.0+cpu (dist-info directory and METADATA Version:)"
  cx "$NODE" "set -e; cd $SITE; d=\$(ls -d torch-*.dist-info | head -1); v=\${d#torch-}; v=\${v%.dist-info};
    echo \$v > /root/health-fault-torch-version; sed -i \"s/^Version: \$v\$/Version: 2.12.0+cpu/\" \$d/METADATA;
    mv \$d torch-2.12.0+cpu.dist-info"
}
remove_torch() {
  cx "$NODE" "set -e; cd $SITE; v=\$(cat /root/health-fault-torch-version); sed -i \"s/^Version: 2.12.0+cpu\$/Version: \$v/\" torch-2.12.0+cpu.dist-info/METADATA;
    mv torch-2.12.0+cpu.dist-info torch-\$v.dist-info; rm /root/health-fault-torch-version"
}
slurm_expect() {  # label node reason-or-empty other other-reason: drain reasons as Slurm holds them
  local label=$1 node=$2 want=$3 other=$4 other_want=$5 got other_got
  got=$(cx "$HEAD" "scontrol show node -o $node" | sed -n 's/.* Reason=\(.*\) \[.*\]$/\1/p')
  other_got=$(cx "$HEAD" "scontrol show node -o $other" | sed -n 's/.* Reason=\(.*\) \[.*\]$/\1/p')
  echo "    slurm after $label: $node reason '${got}', $other reason '${other_got}'; $(grep -o "slurm: .*" "$OUT/$label.log" | head -1)"
  if [ "$got" = "$want" ] && [ "$other_got" = "$other_want" ]; then
    passed=$((passed + 1)); results+=("ok    $label (slurm drain reasons)")
  else
    failed=$((failed + 1)); results+=("FAIL  $label: $node reason '$got' (want '$want'), $other reason '$other_got' (want '$other_want')")
  fi
}

for fault in $FAULTS; do
  echo "=== fault $fault on $NODE"
  case $fault in
    sshd)
      echo "    plant: systemctl stop ssh.service ssh.socket in $NODE"
      cx "$NODE" 'systemctl stop ssh.socket ssh.service 2>/dev/null; systemctl stop ssh.service'
      run_health sshd
      cx "$NODE" 'systemctl start ssh.service'
      expect sshd quick "$NODE" reachable fail "sshd"
      ;;
    frozen)
      # The whole node frozen (cgroup freezer): its kernel still completes TCP handshakes, so
      # SSH connects and then waits forever; only the run's own bounds can end it.
      echo "    plant: podman pause $LAB-$NODE"
      podman pause "$LAB-$NODE" >/dev/null
      start=$SECONDS
      run_health frozen
      took=$((SECONDS - start))
      podman unpause "$LAB-$NODE" >/dev/null
      expect frozen quick "$NODE" reachable fail "start the node"
      if [ "$took" -lt 120 ]; then
        passed=$((passed + 1)); results+=("ok    frozen (the run ended in $took s, under 120 s)")
      else
        failed=$((failed + 1)); results+=("FAIL  frozen: the run took $took s (120 s at most)")
      fi
      ;;
    hung_mount)
      # A read that never returns, as on a hard NFS mount whose server is gone: the node's own
      # clock file on the shared storage becomes a FIFO, which open() for writing waits on.
      echo "    plant: /shared/.gpucluster-health/clock-$NODE replaced by a FIFO (open() blocks, as on a hung NFS mount)"
      cx "$NODE" "rm -f /shared/.gpucluster-health/clock-$NODE && mkfifo /shared/.gpucluster-health/clock-$NODE"
      run_health hung_mount
      cx "$NODE" "rm -f /shared/.gpucluster-health/clock-$NODE"
      expect hung_mount quick "$NODE" shared_storage fail "does not answer $NODE"
      ;;
    torch)
      plant_torch
      run_health torch
      remove_torch
      expect torch quick "$NODE" version.torch fail "python_env --limit $NODE"
      ;;
    slurm)
      # health_slurm_drain: the failing node is drained with the playbook's reason, a node an
      # administrator drained is left alone, and only the playbook's own drain is resumed.
      if ! cx "$HEAD" 'command -v scontrol >/dev/null && scontrol ping | grep -q UP'; then
        echo "    skipped: Slurm does not answer on $HEAD (ansible-playbook playbooks/slurm.yml -i $INV first)"
        continue
      fi
      OTHER=$(python3 -c "import yaml; k=yaml.safe_load(open('$INV/hosts.yml'))['all']['children']['cluster']['children']; print(list(k['workers']['hosts'])[0])")
      echo "    plant: $OTHER drained by hand (\"bad DIMM, ticket 42\"), the torch fault on $NODE, health with -e health_slurm_drain=true"
      cx "$HEAD" "scontrol update NodeName=$OTHER State=DRAIN Reason='bad DIMM, ticket 42'"
      plant_torch
      run_health slurm-drain -e health_slurm_drain=true
      expect slurm-drain quick "$NODE" version.torch fail "python_env --limit $NODE"
      slurm_expect slurm-drain "$NODE" 'gpucluster-health: version.torch' "$OTHER" 'bad DIMM, ticket 42'
      stamp=$(cx "$HEAD" "scontrol show node -o $NODE" | grep -o ' Reason=.*')
      sleep 1   # Slurm stamps a drain reason to the second: a new drain would change the stamp
      run_health slurm-again -e health_slurm_drain=true
      if [ "$(cx "$HEAD" "scontrol show node -o $NODE" | grep -o ' Reason=.*')" = "$stamp" ]; then
        passed=$((passed + 1)); results+=("ok    slurm-again (still drained, the same reason and stamp: no new drain)")
      else
        failed=$((failed + 1)); results+=("FAIL  slurm-again: the drain of $NODE changed ($stamp)")
      fi
      remove_torch
      run_health slurm-resume -e health_slurm_drain=true
      expect slurm-resume quick healthy
      slurm_expect slurm-resume "$NODE" '' "$OTHER" 'bad DIMM, ticket 42'
      cx "$HEAD" "scontrol update NodeName=$OTHER State=RESUME"
      ;;
    port)
      echo "    plant: on $HEAD, iptables -I INPUT -s ${ADDR[$NODE]} -p tcp --dport $PORT -j DROP"
      cx "$HEAD" 'command -v iptables >/dev/null || { apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >/dev/null; }'
      cx "$HEAD" "iptables -I INPUT -s ${ADDR[$NODE]} -p tcp --dport $PORT -j DROP"
      run_health port
      cx "$HEAD" "iptables -D INPUT -s ${ADDR[$NODE]} -p tcp --dport $PORT -j DROP"
      expect port quick "$NODE" rendezvous_port fail "allow ${ADDR[$NODE]} to port $PORT on the head"
      ;;
    shared)
      echo "    plant: in $NODE's mount namespace, mount -o remount,bind,ro /shared"
      nsenter -t "$(cpid "$NODE")" -m mount -o remount,bind,ro /shared
      run_health shared
      nsenter -t "$(cpid "$NODE")" -m mount -o remount,bind,rw /shared
      expect shared quick "$NODE" shared_storage fail "remount /shared read-write"
      ;;
    hosts)
      other=$HEAD
      echo "    plant: in $NODE's /etc/hosts, $other -> 10.213.50.99 instead of ${ADDR[$other]}"
      cx "$NODE" "cp /etc/hosts /root/health-fault-hosts; sed 's/^${ADDR[$other]}\([[:space:]]\+$other\)\$/10.213.50.99\1/' /root/health-fault-hosts > /etc/hosts"
      run_health hosts
      cx "$NODE" 'cat /root/health-fault-hosts > /etc/hosts && rm /root/health-fault-hosts'
      expect hosts quick "$NODE" name_resolution fail "correct /etc/hosts"
      ;;
    nccl_iface)
      echo "    plant: in $NODE's /etc/profile.d/gpucluster-nccl.sh, NCCL_SOCKET_IFNAME=ens9f1 (no such NIC)"
      cx "$NODE" "cp -p /etc/profile.d/gpucluster-nccl.sh /root/health-fault-nccl.sh; sed -i 's/NCCL_SOCKET_IFNAME=[^ ]*/NCCL_SOCKET_IFNAME=ens9f1/' /etc/profile.d/gpucluster-nccl.sh"
      run_health nccl_iface
      cx "$NODE" 'cp -p /root/health-fault-nccl.sh /etc/profile.d/gpucluster-nccl.sh && rm /root/health-fault-nccl.sh'
      expect nccl_iface quick "$NODE" nccl_interface fail "nccl_env --limit $NODE"
      ;;
    clock)
      # Containers share the host's kernel clock, which cannot be moved for one of them, and
      # libfaketime loaded system-wide (/etc/ld.so.preload) breaks sshd in these nodes. So the
      # clock is moved for every Python program on the node, the health probe included: a .pth
      # file in the system's dist-packages imports a module that makes time.time() and
      # time.time_ns() return 30 s less.
      echo "    plant: /usr/local/lib/python3.11/dist-packages/health_fault_clock.{pth,py} in $NODE: Python's time.time() 30 s behind"
      cx "$NODE" 'd=/usr/local/lib/python3.11/dist-packages; mkdir -p $d; cat > $d/health_fault_clock.py <<PY
# gpucluster health fault (lab/tests/health_faults.sh): the clock of this node runs 30 s behind
import time as _time
_real_time, _real_time_ns = _time.time, _time.time_ns
_time.time = lambda: _real_time() - 30.0
_time.time_ns = lambda: _real_time_ns() - 30 * 10**9
PY
echo "import health_fault_clock" > $d/health_fault_clock.pth; python3 -c "import time; print(\"node python clock now\", time.time())"'
      date +"    controller clock now %s.%N"
      run_health clock
      cx "$NODE" 'rm -f /usr/local/lib/python3.11/dist-packages/health_fault_clock.py /usr/local/lib/python3.11/dist-packages/health_fault_clock.pth'
      expect clock quick "$NODE" clock_offset fail "synchronise the clock of $NODE"
      ;;
    link)
      echo "    plant: in $NODE, tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 50ms"
      cx "$NODE" 'tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 50ms'
      run_health link -e health_tier=deep -e '{"health_deep_tests": ["bandwidth"]}'
      cx "$NODE" 'tc qdisc del dev eth0 root'
      expect link deep "$NODE" bandwidth fail "check the NIC of $NODE"
      ;;
    *) echo "unknown fault $fault (known: $ALL_FAULTS)"; exit 2 ;;
  esac
done

echo "=== healthy again: every fault removed"
run_health healthy-after
expect healthy-after quick healthy

echo
echo "=== summary"
printf '%s\n' "${results[@]}"
echo "health faults: $passed passed, $failed failed (logs and reports in $OUT)"
[ "$failed" -eq 0 ]

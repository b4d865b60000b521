#!/usr/bin/env bash
# Figures of the cluster tests on a lab of 8 nodes, all in one run:
#   1. all pairs of 4 and of 8 nodes: the round-robin schedule (disjoint pairs at once) against
#      one pair at a time, wall time of playbooks/bandwidth.yml;
#   2. one pair: the Gbit/s the bandwidth module reports against iperf3 typed by hand over ssh on the
#      same pair (same streams and duration), alternating, ratio of the medians;
#   3. the torch all-reduce busbw at the largest size on 4 nodes against the median pair
#      bandwidth of the same 4 nodes (both in Gbit/s);
#   4. a planted fault: one node's sending rate throttled with tc (tbf); the matrix must flag
#      exactly that node's links and name it.
#
#   ansible-playbook lab/lab.yml -e lab_name=lab-net -e lab_subnet=10.213.40.0/24 \
#       -e lab_inventory_dir=inventories/lab-net -e lab_nodes=8
#   benchmarks/network_matrix.sh        # INV=inventories/lab-net DURATION=2 ROUNDS=5 THROTTLE=1gbit PARTS="1 2 3 4"
#   PARTS=2 INV=<a lab of 2 or more> benchmarks/network_matrix.sh      # part 2 needs 2 nodes only
#   PARTS=1 MATRIX_NODES=8 benchmarks/network_matrix.sh                # part 1 at 8 nodes only
#
# THROTTLE must be well under the normal rate of a link (tbf with a 64 kB burst and several
# streams gets well under its rate: 1gbit gave 0.14-0.44 Gbit/s here).
#
# On the lab every node is a container on one machine, so pairs running at the same time share
# its CPUs: the rates are those of this machine, and the ratios are what to read.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# shellcheck source=benchmarks/lib.sh
source benchmarks/lib.sh
INV=${INV:-inventories/lab-net}
DURATION=${DURATION:-2}
ROUNDS=${ROUNDS:-5}
THROTTLE=${THROTTLE:-1gbit}
# iperf3's warm-up left out of both figures of part 2 (-O), as the role does (cluster_tests_bandwidth_omit)
OMIT=${OMIT:-1}
PARTS=${PARTS:-1 2 3 4}
MATRIX_NODES=${MATRIX_NODES:-4 8}
part() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=$(mktemp -d /tmp/network-matrix.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

mapfile -t NODES < <(ansible-inventory -i "$INV" --list | python3 -c '
import json, re, sys
inv = json.load(sys.stdin)
key = lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)]
head = inv.get("head", {}).get("hosts", [])
print("\n".join(head + sorted(inv.get("workers", {}).get("hosts", []), key=key)))')
need=2
{ part 1 || part 4; } && need=8
part 3 && [ "$need" -lt 4 ] && need=4
[ "${#NODES[@]}" -ge "$need" ] || { echo "network_matrix: $INV has ${#NODES[@]} node(s), parts $PARTS need $need (see the top of this file)" >&2; exit 2; }
address() { ansible-inventory -i "$INV" --host "$1" | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h.get("cluster_address") or h["ansible_host"])'; }
key=$(sed -n 's/^ *ansible_ssh_private_key_file: //p' "$INV/hosts.yml")
opts=$(sed -n '/ansible_ssh_common_args/,/IdentitiesOnly/p' "$INV/hosts.yml" | grep -o -- '-o [^ ]*' | tr '\n' ' ')
user=$(sed -n 's/^ *ansible_user: //p' "$INV/hosts.yml")
on() { local ip; ip=$(address "$1"); shift; ssh -i "$key" $opts "$user@$ip" "$@"; }
json_list() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@"; }

# bandwidth.yml on the given nodes; the report lands in $OUT/<tag>/bandwidth.json; prints the wall time
matrix() {
  local tag=$1 schedule=$2; shift 2
  mkdir -p "$OUT/$tag"
  local t0 t1
  t0=$(date +%s.%N)
  ansible-playbook playbooks/bandwidth.yml -i "$INV" -e cluster_tests_fail=false \
    -e "{\"cluster_tests_nodes\": $(json_list "$@"), \"cluster_tests_bandwidth_schedule\": \"$schedule\",
         \"cluster_tests_bandwidth_duration\": $DURATION, \"cluster_tests_report_dir\": \"$OUT/$tag\"}" \
    >"$OUT/$tag.log" || { tail -30 "$OUT/$tag.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
field() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"r": r}))' "$@"; }

if part 1 || part 3; then
echo "== 1. all pairs: round-robin against one pair at a time (${DURATION} s per direction)"
for n in $MATRIX_NODES; do
  if ! part 1 && [ "$n" != 4 ]; then continue; fi
  set -- "${NODES[@]:0:$n}"
  rr=$(matrix "rr$n" round_robin "$@")
  if ! part 1; then echo "4 nodes: round-robin $rr s (for part 3)"; continue; fi
  seq=$(matrix "seq$n" sequential "$@")
  printf '%d nodes, %d pairs: round-robin %.0f s in %s rounds, sequential %.0f s; ratio sequential / round-robin %.2f\n' \
    "$n" $((n * (n - 1) / 2)) "$rr" "$(field "$OUT/rr$n/bandwidth.json" 'r["rounds"]')" \
    "$seq" "$(echo "$seq / $rr" | bc -l)"
  printf '   median link: round-robin %s Gbit/s, sequential %s Gbit/s (pairs at once share this machine)\n' \
    "$(field "$OUT/rr$n/bandwidth.json" '"%.2f" % r["link_median_gbps"]')" \
    "$(field "$OUT/seq$n/bandwidth.json" '"%.2f" % r["link_median_gbps"]')"
done
fi

if part 2; then
echo "== 2. one pair: the bandwidth module against iperf3 by hand (${NODES[0]} -> ${NODES[1]}, 4 streams, ${DURATION} s after ${OMIT} s left out, $ROUNDS rounds)"
a=${NODES[0]}; b=${NODES[1]}; b_ip=$(address "$b")
mod=(); hand=()
for i in $(seq "$ROUNDS"); do
  mkdir -p "$OUT/pair$i"
  ansible-playbook playbooks/bandwidth.yml -i "$INV" -e cluster_tests_fail=false \
    -e "{\"cluster_tests_bandwidth_pairs\": [[\"$a\", \"$b\"]], \"cluster_tests_bandwidth_duration\": $DURATION, \"cluster_tests_bandwidth_omit\": $OMIT,
         \"cluster_tests_bandwidth_both_directions\": false, \"cluster_tests_report_dir\": \"$OUT/pair$i\"}" >"$OUT/pair$i.log"
  mod+=("$(field "$OUT/pair$i/bandwidth.json" 'r["links"][0]["gbps"]')")
  on "$b" "iperf3 -s -1 -D -p 5202 -B $b_ip"
  sleep 1
  hand+=("$(on "$a" "iperf3 -c $b_ip -p 5202 -P 4 -t $DURATION -O $OMIT -J" \
           | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9)')")
done
print_series 'bandwidth module (Gbit/s): ' 2 "${mod[*]}"
print_series 'iperf3 by hand (Gbit/s): ' 2 "${hand[*]}"
print_median_ratio 'ratio module / by hand: ' "${mod[*]}" "${hand[*]}"
fi

if part 3; then
echo "== 3. all-reduce busbw at the largest size against the pair bandwidth (4 nodes)"
set -- "${NODES[@]:0:4}"
# torch once, into /shared/env (the lab's /shared is one directory on every node), linked as
# /opt/gpucluster/env on the 4 nodes: one offline install instead of four at once
ansible -i "$INV" "$1" -m ansible.builtin.shell -a \
  'test -x /shared/env/bin/torchrun || { python3 -m venv /shared/env &&
   /shared/env/bin/pip install -q --no-index --find-links /opt/wheelhouse torch==2.13.0; }' >"$OUT/torch.log"
ansible -i "$INV" "$(IFS=,; echo "$*")" -m ansible.builtin.shell -a \
  'mkdir -p /opt/gpucluster && { test -e /opt/gpucluster/env || ln -s /shared/env /opt/gpucluster/env; }' >>"$OUT/torch.log"
mkdir -p "$OUT/coll"
ansible-playbook playbooks/collective.yml -i "$INV" -e cluster_tests_fail=false \
  -e "{\"cluster_tests_nodes\": $(json_list "$@"), \"cluster_tests_collective_sizes\": [\"1M\", \"16M\", \"64M\"],
       \"cluster_tests_report_dir\": \"$OUT/coll\"}" >"$OUT/coll.log" || { tail -30 "$OUT/coll.log" >&2; exit 1; }
python3 - "$OUT/coll/collective.json" "$OUT/rr4/bandwidth.json" <<'PY'
import json, sys
coll, bw = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for line in coll['lines']:
    print('   ' + line)
busbw_gbit = coll['max_busbw_gbs'] * 8
print('busbw at %d bytes: %.2f Gbit/s; median pair bandwidth of the same 4 nodes: %.2f Gbit/s; ratio %.2f'
      % (coll['rows'][-1]['size'], busbw_gbit, bw['link_median_gbps'], busbw_gbit / bw['link_median_gbps']))
PY
fi

part 4 || exit 0
slow=${NODES[5]}
# the NIC that holds the node's cluster address (the lab names them differently per node)
nic=$(on "$slow" "ip -o -4 addr show to $(address "$slow")" | awk '{print $2; exit}')
[ -n "$nic" ] || { echo "network_matrix: no NIC of $slow holds $(address "$slow")" >&2; exit 1; }
echo "== 4. planted fault: $slow sends at most $THROTTLE (tc tbf on $nic), 8 nodes"
on "$slow" "sudo tc qdisc replace dev $nic root tbf rate $THROTTLE burst 64kb latency 50ms"
trap 'on "$slow" "sudo tc qdisc del dev $nic root" || true; rm -rf "$OUT"' EXIT
matrix fault round_robin "${NODES[@]}" >/dev/null
on "$slow" "sudo tc qdisc del dev $nic root"
trap 'rm -rf "$OUT"' EXIT
python3 - "$OUT/fault/bandwidth.json" "$slow" <<'PY'
import json, sys
r, slow = json.load(open(sys.argv[1])), sys.argv[2]
for line in r['lines']:
    print('   ' + line)
flagged = sorted(tuple(sorted((f['a'], f['b']))) for f in r['slow_links'])
expected = sorted(tuple(sorted((slow, n))) for n in r['nodes'] if n != slow)
print('flagged %d link(s); %s\'s links: %d; exactly those: %s; named: %s'
      % (len(flagged), slow, len(expected), flagged == expected, ', '.join(r['culprits']) or 'none'))
sys.exit(0 if flagged == expected and r['culprits'] == [slow] else 1)
PY

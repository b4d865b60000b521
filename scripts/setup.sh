#!/usr/bin/env bash
# One entry point for the controller: system packages, a pinned Python tool chain in
# .venv, and the collection linked where Ansible finds it. Re-runnable; each step is
# skipped when already done. Source scripts/env.sh afterwards (the Makefile does).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# System packages the lab and the tests use (prometheus: its promtool tests the shipped alert
# rules; Debian has no smaller package with it. chromium and a font: the report pages' browser
# test opens them in headless Chromium, driven by playwright from .venv).
APT_PACKAGES=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs iptables
              iperf3 pdsh openssh-client python3-venv git make rsync prometheus
              chromium fonts-dejavu-core)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # only promtool is wanted: the package's server is not left running on a systemd controller
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi

# Python tool chain, pinned; reinstalled only when requirements change.
PY=${GPUCLUSTER_PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(cat requirements/controller.txt requirements/sanity.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the controller tool chain into .venv"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  if ! .venv/bin/python -m pip install -q -r requirements/controller.txt -r requirements/sanity.txt >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2; exit 1
  fi
  echo "$want" > "$stamp"
fi

# The repository is the collection: link it where ansible.cfg looks.
link=.build/collections/ansible_collections/gpucluster/multinode
mkdir -p "$(dirname "$link")"
if [ "$(readlink "$link" 2>/dev/null)" != "$ROOT" ]; then
  ln -sfn "$ROOT" "$link"
fi
echo "setup: ready ($(.venv/bin/ansible --version | head -1))"

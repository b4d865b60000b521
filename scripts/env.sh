# Sourced by the Makefile and the test script: the project's own tool chain and
# container settings, without touching the user's global configuration.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/lab/containers.conf"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
export ANSIBLE_COLLECTIONS_PATH="$ROOT/.build/collections"
export ANSIBLE_FORCE_COLOR="${ANSIBLE_FORCE_COLOR:-0}"
export PY_COLORS="${PY_COLORS:-0}"

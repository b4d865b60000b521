#!/usr/bin/env bash
# ansible-test sanity on a snapshot of the working tree (make test's sanity step).
#   bash scripts/sanity.sh                  # the tests below
#   bash scripts/sanity.sh --test pep8      # one test
# ansible-test wants the collection at .../ansible_collections/<namespace>/<name> and resolves
# links, so the tree is copied (the files git would see) to .build/sanity; its per-test virtual
# environments live under .build/sanity-home (HOME for this run only), built once from the
# pinned requirements of ansible-test itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
dest=.build/sanity/ansible_collections/gpucluster/multinode
rm -rf .build/sanity && mkdir -p "$dest"
git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && printf '%s\n' "$f"; done \
  | tar -cf - -T - | tar -xf - -C "$dest"
git -C "$dest" init -q && git -C "$dest" add -A \
  && git -C "$dest" -c user.name=sanity -c user.email=sanity@localhost commit -qm snapshot
home=$ROOT/.build/sanity-home
pip_version=$(python -c 'from ansible_test._internal.python_requirements import PIP_VERSION; print(PIP_VERSION)' 2>/dev/null || echo 24.2)
mkdir -p "$home/.ansible/test/cache"
cp scripts/sanity-get-pip.py "$home/.ansible/test/cache/get_pip_${pip_version//./_}.py"
py=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
tests=(--test action-plugin-docs --test ansible-doc --test compile --test empty-init --test ignores
       --test import --test line-endings --test no-assert --test no-get-exception --test no-illegal-filenames
       --test no-smart-quotes --test pep8 --test replace-urlopen --test runtime-metadata --test shebang
       --test symlinks --test use-argspec-type-path --test use-compat-six --test validate-modules)
[ $# -gt 0 ] && tests=("$@")
cd "$dest"
HOME=$home ansible-test sanity --python "$py" --color no "${tests[@]}"

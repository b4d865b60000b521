#!/bin/sh
# Stand-in for a Miniforge installer (no conda channel is reachable in the tests): takes the
# same batch-mode options, records how it was called, and installs a `conda` that records its
# own command lines and, for `env create --prefix P`, makes P/bin/python.
set -e
prefix=
while [ $# -gt 0 ]; do
  case $1 in -p) prefix=$2; shift ;; esac
  shift
done
[ -n "$prefix" ] || { echo "no -p" >&2; exit 2; }
mkdir -p "$prefix/bin"
echo "installer -b -p $prefix" >> "$prefix.calls"
cat > "$prefix/bin/conda" <<'CONDA'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
echo "conda $*" >> "$here.calls"
env=
while [ $# -gt 0 ]; do
  case $1 in --prefix) env=$2; shift ;; esac
  shift
done
mkdir -p "$env/bin" && ln -sf "$(command -v python3)" "$env/bin/python"
CONDA
chmod +x "$prefix/bin/conda"

"""Stand-in for pip's get-pip.py, which ansible-test downloads to bootstrap pip into the empty
virtual environments of its sanity tests (from a host this machine may not reach): pip from the
interpreter's own ensurepip, then the pip version ansible-test asks for, from the package index
(configured as for any pip on this machine)."""

import subprocess
import sys

# ensurepip in a child: in this process it would set PIP_CONFIG_FILE=/dev/null for what follows
if subprocess.call([sys.executable, '-m', 'ensurepip', '--upgrade']) != 0:
    sys.exit(1)
args = [a for a in sys.argv[1:] if a not in ('--no-setuptools', '--no-wheel')]
sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install'] + args))

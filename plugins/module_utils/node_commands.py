# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Running a test program on a node: its environment (the NCCL profile sourced), the JSON
lines it prints, the tail of its output."""

from __future__ import annotations

import json
import os

_ENV_DUMP = 'set -a; for f in "$@"; do if [ -r "$f" ]; then . "$f" >/dev/null 2>&1; fi; done; env -0'


def node_environment(module, files=None, extra=None):
    """os.environ plus what the shell files set (sourced in order when readable), plus extra."""
    env = dict(os.environ)
    files = [f for f in (files or []) if f]
    if files:
        rc, out, err = module.run_command(['/bin/sh', '-c', _ENV_DUMP, 'env'] + files)
        if rc == 0:
            for item in out.split('\0'):
                key, sep, value = item.partition('=')
                if sep and key and not key.startswith('BASH_FUNC_'):
                    env[key] = value
    for key, value in (extra or {}).items():
        env[str(key)] = str(value)
    return env


def json_lines(text, prefix):
    """The JSON objects of the lines that start with prefix (other lines are ignored)."""
    found = []
    for line in (text or '').splitlines():
        at = line.find(prefix)
        if at < 0:
            continue
        try:
            found.append(json.loads(line[at + len(prefix):]))
        except ValueError:
            continue
    return found


def tail(text, lines=15):
    return '\n'.join((text or '').strip().splitlines()[-lines:])

"""Run a throw-away playbook with ansible-playbook and read what its first task showed on each host:
for tests that render role defaults and vars files as Ansible does (no node is contacted)."""

from __future__ import annotations

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def first_task_msgs(directory, extra=None):
    """Run directory/play.yml against directory/hosts.yml with this collection, each of extra as a JSON
    -e; {host: msg of the play's first task}. A failed run fails the test with its output."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_STDOUT_CALLBACK='ansible.builtin.json',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    cmd = ['ansible-playbook', '-i', str(directory / 'hosts.yml'), str(directory / 'play.yml')]
    for key, value in (extra or {}).items():
        cmd += ['-e', json.dumps({key: value})]
    proc = subprocess.run(cmd, cwd=str(directory), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)['plays'][0]['tasks'][0]['hosts']
    return {host: r['msg'] for host, r in results.items()}


DEFAULTS_PLAY = """
- hosts: h1
  gather_facts: false
  vars_files: {files}
  tasks:
    - name: Show the values
      ansible.builtin.debug:
        msg: "{{{{ {names} }}}}"
"""


def role_defaults(directory, roles, names, extra=None):
    """The values of names as the roles' defaults/main.yml give them together (with extra as -e), on
    one local host: {name: value}."""
    files = [os.path.join(ROOT, 'roles', r, 'defaults', 'main.yml') for r in roles]
    shown = '{' + ', '.join("'%s': %s" % (n, n) for n in names) + '}'
    (directory / 'hosts.yml').write_text('all: {hosts: {h1: {ansible_connection: local, ansible_python_interpreter: python3}}}\n')
    (directory / 'play.yml').write_text(DEFAULTS_PLAY.format(files=json.dumps(files), names=shown))
    return first_task_msgs(directory, extra)['h1']

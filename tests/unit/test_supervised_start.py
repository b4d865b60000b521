"""A supervised start (roles/training) refuses a supervisor host site.yml's supervisor step did not prepare
before anything of the job is written (training_metrics_dir, the jobs directory, the example scripts), and makes
a missing training_metrics_dir as a start that reads the job's figures does, before its supervisor needs it."""

from __future__ import annotations

import os

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

TASKS = os.path.join(os.path.dirname(__file__), '..', '..', 'roles', 'training', 'tasks')
# Modules that write on a node; everything else the start runs before them reads.
WRITES = {'ansible.builtin.file', 'ansible.builtin.copy', 'ansible.builtin.template', 'ansible.builtin.lineinfile',
          'ansible.builtin.blockinfile', 'ansible.builtin.unarchive', 'ansible.builtin.systemd_service'}


def _tasks(name):
    with open(os.path.join(TASKS, name)) as handle:
        return yaml.safe_load(handle)


def _flat(tasks):
    for task in tasks or []:
        if 'block' in task:
            yield from _flat(task['block'])
        else:
            yield task


def _module(task):
    return next((k for k in task if k.startswith(('ansible.builtin.', 'gpucluster.multinode.'))), None)


def _included(task):
    step = task.get('ansible.builtin.include_tasks') or task.get('ansible.builtin.import_tasks')
    return step.get('file') if isinstance(step, dict) else step


def _run_order(name):
    """The modules a task file runs, includes of the role's own files expanded in place (the state's own file
    aside), with each include's when."""
    for task in _flat(_tasks(name)):
        included = _included(task)
        if included and '{{' not in included:
            yield ('include', included, task.get('when'))
            yield from _run_order(included)
        else:
            yield (_module(task), task.get('name'), task.get('when'))


def _true(when, **values):
    templar = Templar(loader=DataLoader(), variables=values)
    whens = when if isinstance(when, list) else [when]
    return all(templar.evaluate_conditional(trust_as_template(str(w))) for w in whens)


def test_the_supervisor_host_is_checked_before_the_start_writes_anything():
    order = list(_run_order('validate.yml')) + list(_run_order('started.yml'))
    check = next(i for i, step in enumerate(order) if step[:2] == ('include', 'supervisor_host.yml'))
    assert _true(order[check][2], __training_supervised=True)
    first_write = next(i for i, step in enumerate(order) if step[0] in WRITES)
    assert check < first_write, order[first_write]
    # what the check runs only reads (stat, slurp) and refuses (assert)
    assert {m for m, _n, _w in _run_order('supervisor_host.yml')} == {
        'ansible.builtin.assert', 'ansible.builtin.stat', 'ansible.builtin.slurp'}
    # and the start checks it once: supervise_check.yml (after the examples are written) no longer does
    assert not any(n.startswith('Look for what the supervisor runs with') for _m, n, _w in _run_order('supervise_check.yml'))


def test_a_supervised_start_makes_training_metrics_dir_as_a_start_that_reads_the_figures_does():
    include = next(step for step in _run_order('validate.yml') if step[:2] == ('include', 'metrics_dir.yml'))
    when = include[2]
    assert _true(when, training_metrics_dir='/var/lib/node_exporter', __training_reads_progress=True,
                 __training_supervised=False)
    assert _true(when, training_metrics_dir='/var/lib/node_exporter', __training_reads_progress=False,
                 __training_supervised=True)
    assert not _true(when, training_metrics_dir='/var/lib/node_exporter', __training_reads_progress=False,
                     __training_supervised=False)
    assert not _true(when, training_metrics_dir='', __training_reads_progress=True, __training_supervised=True)
    # it is made where missing, owned by the training account
    made = next(t for t in _flat(_tasks('metrics_dir.yml')) if _module(t) == 'ansible.builtin.file')
    assert made['ansible.builtin.file']['state'] == 'directory' and 'training_user' in made['ansible.builtin.file']['owner']


def _supervise_keys(role_path):
    """The variables a supervised start hands its supervisor (vars.json), rendered as started.yml renders them."""
    task = next(t for t in _flat(_tasks('started.yml'))
                if '__training_supervise_keys' in (t.get('vars') or {}))
    with open(os.path.join(TASKS, '..', 'vars', 'main.yml')) as handle:
        own = yaml.safe_load(handle)['__training_supervisor_own_vars']

    def lookup(name, path):  # the file lookup: the file's text
        assert name == 'ansible.builtin.file'
        with open(path) as handle:
            return handle.read()

    templar = Templar(loader=DataLoader(), variables={'role_path': role_path, '__training_supervisor_own_vars': own,
                                                      'lookup': lookup})
    return templar.template(trust_as_template(task['vars']['__training_supervise_keys'])), own


def test_the_supervisor_restarts_a_job_with_every_variable_of_the_role_but_its_own(tmp_path):
    """vars.json holds every variable of the role's argument specs but those each supervisor run sets itself or
    that are its own settings (vars/main.yml): a variable added to the role reaches the restarts without a list
    to keep; those a hand list once forgot are there."""
    role = os.path.join(TASKS, '..')
    with open(os.path.join(role, 'meta', 'argument_specs.yml')) as handle:
        specs = yaml.safe_load(handle)
    options = specs['argument_specs']['main']['options']
    keys, own = _supervise_keys(role)
    assert set(own) <= set(options), sorted(set(own) - set(options))
    assert sorted(keys) == sorted(set(options) - set(own))
    assert {'training_deepspeed_ops', 'training_flight_dump_timeout', 'training_log_lines',
            'training_progress_window', 'training_launcher', 'training_env', 'training_container_image'} <= set(keys)
    assert not {'training_state', 'training_attempt', 'training_supervise', 'training_restarts',
                'training_wait'} & set(keys)
    # a new variable of the role is handed on as it is declared
    (tmp_path / 'meta').mkdir()
    options['training_new_knob'] = {'type': 'int', 'default': 1, 'description': 'a new one'}
    (tmp_path / 'meta' / 'argument_specs.yml').write_text(yaml.safe_dump(specs))
    assert 'training_new_knob' in _supervise_keys(str(tmp_path))[0]

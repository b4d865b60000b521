"""A role README's variable tables agree with its argument spec: a variable is listed once, every
listed variable is one the role takes, every variable the role takes is named in its README, and a
table is not broken by a blank line (which ends it on every Markdown renderer). The README and docs/
describe a role's variables in no table of their own (the role's README does), and every variable
their tables name is one the collection reads."""

from __future__ import annotations

import collections
import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
               for p in glob.glob(os.path.join(ROOT, 'roles', '*', 'meta', 'argument_specs.yml')))


def _spec(role, root=os.path.join(ROOT, 'roles')):
    """The options of every entry point of the role (main, and e.g. a role's other task files)."""
    with open(os.path.join(root, role, 'meta', 'argument_specs.yml')) as f:
        specs = yaml.safe_load(f)['argument_specs']
    out = {}
    for entry in specs.values():
        out.update(entry.get('options') or {})
    return out


def _main_spec(role):
    with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as f:
        return yaml.safe_load(f)['argument_specs']['main']['options']


def _names(cell, spec=()):
    """The variables a table's first cell lists: `a`, `a` / `b`, `a`, `b`, and shorthands after a
    first name: `health_disk_free_warn_pct` / `_fail_pct`, `training_container_gpus` / `_extra_args` (the
    first name with its last words replaced, or followed by the shorthand: `training_flight_dump` /
    `_timeout`; of the readings, the one the spec knows, else the closest)."""
    names = []
    for word in re.findall(r'`([a-z0-9_]+)`', cell):
        if word.startswith('_') and names:
            words = names[0].split('_')
            readings = ['_'.join(words[:cut]) + word for cut in range(len(words) - 1, 0, -1)] + [names[0] + word]
            names.append(next((name for name in readings if name in spec), readings[0]))
        else:
            names.append(word)
    return names


def table_rows(text, header, names):
    """(line number, names(first cell)) of every row of every table whose header line starts with
    `header`, and the line numbers of blank lines that split such a table (a row follows with no header)."""
    lines = text.splitlines()
    rows, splits, inside = [], [], False
    for number, line in enumerate(lines, 1):
        if line.startswith(header):
            inside = True
        elif inside and line.startswith('| ---'):
            continue
        elif inside and line.startswith('|'):
            rows.append((number, names(line.split('|')[1])))
        elif inside:
            inside = False
            following = lines[number:number + 2]
            if line == '' and following and following[0].startswith('| `') and not (
                    len(following) > 1 and following[1].startswith('| ---')):
                splits.append(number)
    return rows, splits


def variable_tables(text, spec=()):
    """(line number, names) of every row of every table whose header is `| variable |`, and the
    blank lines that split such a table."""
    return table_rows(text, '| variable |', lambda cell: _names(cell, spec))


def test_the_names_of_a_shorthand_row_are_read_whole():
    assert _names(' `health_disk_free_warn_pct` / `_fail_pct` ') == [
        'health_disk_free_warn_pct', 'health_disk_free_warn_fail_pct']
    assert _names(' `health_disk_free_warn_pct` / `_fail_pct` ', {'health_disk_free_fail_pct'}) == [
        'health_disk_free_warn_pct', 'health_disk_free_fail_pct']
    assert _names('`t_c_gpus` / `_memlock` / `_extra_args`', {'t_c_memlock', 't_c_extra_args'}) == [
        't_c_gpus', 't_c_memlock', 't_c_extra_args']
    rows, splits = variable_tables('| variable | default |\n| --- | --- |\n| `a_x` | 1 |\n\n| `b_x` | 2 |\n')
    assert rows == [(3, ['a_x'])] and splits == [4]


@pytest.mark.parametrize('role', ROLES)
def test_the_readme_tables_agree_with_the_argument_spec(role):
    spec = _spec(role)
    with open(os.path.join(ROOT, 'roles', role, 'README.md')) as f:
        text = f.read()
    rows, splits = variable_tables(text, spec)
    listed = [name for _, names in rows for name in names]
    twice = sorted(name for name, count in collections.Counter(listed).items() if count > 1)
    unknown = sorted(set(listed) - set(spec))
    unnamed = sorted(name for name in _main_spec(role) if name not in listed and '`%s`' % name not in text)
    assert (twice, unknown, unnamed, splits) == ([], [], [], []), (
        'listed twice %s; listed but not in meta/argument_specs.yml %s; in the spec but named nowhere in '
        'the README %s; blank line inside a variable table at line(s) %s' % (twice, unknown, unnamed, splits))


def _docs():
    return [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def _known_elsewhere():
    """{variable: where} of what the tables outside roles/ may name: the lab role's variables (docs/lab.md
    is its description), the cluster-wide values (cluster_<name> of module_utils/cluster_defaults.py) and
    the inventory contract's own (plugin_utils/inventory_contract.py reads them)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, 'plugins', 'module_utils'))
    try:
        import cluster_defaults
    finally:
        sys.path.pop(0)
    known = dict(('cluster_' + n, 'cluster_defaults.py') for n in list(cluster_defaults.DEFAULTS) + list(cluster_defaults.DERIVED))
    with open(os.path.join(ROOT, 'plugins', 'plugin_utils', 'inventory_contract.py')) as f:
        known.update((n, 'inventory_contract.py') for n in re.findall(r"'([a-z]+_[a-z0-9_]+)'", f.read()))
    known.update((n, 'lab/roles/lab') for n in _spec('lab', os.path.join(ROOT, 'lab', 'roles')))
    return known


def doc_table_problems(paths, role_vars, known):
    """The lines that describe a role's variable outside its README (a table whose second column is its
    default), name a variable nothing reads, or describe one variable in two tables (tables with a
    `meaning` column; a table of values set, `| variable | value | why |`, names what is described
    elsewhere)."""
    problems, seen = [], {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        rows, splits = variable_tables(text, role_vars)
        headers = dict((n, line) for n, line in enumerate(text.splitlines(), 1) if re.match(r'\|\s*variable\s*\|', line))
        described = set(n for n, line in headers.items() if re.match(r'\|\s*variable\s*\|\s*default\s*\|', line))
        meaning = set(n for n, line in headers.items() if 'meaning' in line)
        where = os.path.relpath(path, ROOT)
        for number, names in rows:
            for name in names:
                if name in role_vars and _table_of(text, number) in described:
                    problems.append('%s:%d describes %s, a variable of role %s: its README\'s table does'
                                    % (where, number, name, role_vars[name]))
                if name not in role_vars and name not in known:
                    problems.append('%s:%d names %s, which no role, lab role or cluster-wide value reads'
                                    % (where, number, name))
                if _table_of(text, number) not in meaning:
                    continue
                if name in seen:
                    problems.append('%s:%d describes %s, described at %s too' % (where, number, name, seen[name]))
                seen.setdefault(name, '%s:%d' % (where, number))
        problems += ['%s:%d: blank line inside a variable table' % (where, n) for n in splits]
    return problems


def _table_of(text, number):
    """The line number of the header of the table line number is in."""
    lines = text.splitlines()
    at = number - 1
    while at > 0 and lines[at - 1].startswith('|'):
        at -= 1
    return at + 1


def test_the_docs_describe_no_role_variable_and_name_only_what_is_read():
    role_vars = dict((name, role) for role in ROLES for name in _spec(role))
    assert doc_table_problems(_docs(), role_vars, _known_elsewhere()) == []


def test_a_docs_table_of_a_role_s_variables_or_of_an_unknown_one_is_refused(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('| variable | default | meaning |\n| --- | --- | --- |\n| `training_state` | `started` | x |\n'
                    '| `cluster_user` | `train` | y |\n\n| variable | value | why |\n| --- | --- | --- |\n'
                    '| `training_state` | `status` | z |\n| `cluster_nosuch` | 1 | w |\n\n'
                    '| variable | where | meaning |\n| --- | --- | --- |\n| `cluster_user` | all | v |\n')
    problems = doc_table_problems([str(page)], {'training_state': 'training'}, {'cluster_user': 'x'})
    where = os.path.relpath(str(page), ROOT)
    assert problems == [
        '%s:3 describes training_state, a variable of role training: its README\'s table does' % where,
        '%s:9 names cluster_nosuch, which no role, lab role or cluster-wide value reads' % where,
        '%s:13 describes cluster_user, described at %s:4 too' % (where, where)]


def _read_cluster_values():
    """{name: first file} of the cluster-wide values a role, playbook or plugin reads through the cluster_value
    lookup."""
    found = {}
    for top in ('roles', 'playbooks', 'plugins', 'lab'):
        for path in sorted(glob.glob(os.path.join(ROOT, top, '**', '*.y*ml'), recursive=True)):
            with open(path) as f:
                for name in re.findall(r"""lookup\(\s*['"]gpucluster\.multinode\.cluster_value['"]\s*,\s*['"]([a-z0-9_]+)['"]""",
                                       f.read()):
                    found.setdefault(name, os.path.relpath(path, ROOT))
    return found


def test_every_cluster_wide_value_a_role_reads_is_in_the_readmes_inventory_table():
    # the inventory table (| variable | where | meaning |) is where a user learns what cluster_<name> sets
    with open(os.path.join(ROOT, 'README.md')) as f:
        text = f.read()
    rows = [line for line in text.splitlines() if line.startswith('| `cluster_')]
    described = set(re.findall(r'`(cluster_[a-z0-9_]+)`', '\n'.join(line.split('|')[1] for line in rows)))
    read = _read_cluster_values()
    assert len(read) >= 25   # the lookup's calls were found (the pattern matches how roles write it)
    missing = ['cluster_%s (read in %s)' % (name, where) for name, where in sorted(read.items())
               if 'cluster_' + name not in described]
    assert not missing, 'README.md\'s inventory table does not describe: %s' % ', '.join(missing)


def cluster_file_rows(text):
    """(line number, [field, ...]) of every row of the k8s README's cluster-file table (`| field |`):
    `name`, `resources.cpu`, `train.master_port`, `train.agent_port`, ..., and the blank lines that split it."""
    return table_rows(text, '| field |', lambda cell: re.findall(r'`([a-z_]+(?:\.[a-z_]+)?)`', cell))


def test_the_k8s_cluster_file_table_lists_every_field_the_file_takes_once_and_no_other():
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
    nested = {'resources': kc.RESOURCES, 'network': kc.NETWORK, 'storage': kc.STORAGE, 'train': kc.TRAIN,
              'nccl': kc.NCCL, 'security': kc.SECURITY}
    taken = set(name for name in kc.TOP if name not in nested)
    taken.update('%s.%s' % (parent, name) for parent, names in nested.items() for name in names)
    assert set(nested) <= set(kc.TOP)
    with open(os.path.join(ROOT, 'roles', 'k8s', 'README.md')) as f:
        rows, splits = cluster_file_rows(f.read())
    assert not splits, 'a blank line splits the cluster-file table of roles/k8s/README.md at line %s' % splits
    seen = collections.Counter(name for _, names in rows for name in names)
    assert len(rows) >= 30   # the table was found
    twice = sorted(name for name, count in seen.items() if count > 1)
    assert not twice, 'roles/k8s/README.md lists these cluster-file fields twice: %s' % ', '.join(twice)
    unknown = sorted(set(seen) - taken)
    assert not unknown, 'roles/k8s/README.md lists fields a cluster file does not take: %s' % ', '.join(unknown)
    missing = sorted(taken - set(seen))
    assert not missing, 'roles/k8s/README.md does not list the cluster-file fields: %s' % ', '.join(missing)

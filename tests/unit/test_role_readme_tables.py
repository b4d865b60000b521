"""A role README's variable tables agree with its argument spec: a variable is listed once, every
listed variable is one the role takes, every variable the role takes is named in its README, and a
table is not broken by a blank line (which ends it on every Markdown renderer)."""

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


def _spec(role):
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


def variable_tables(text, spec=()):
    """(line number, names) of every row of every table whose header is `| variable |`, and the
    line numbers of blank lines that split such a table (a row follows with no header)."""
    lines = text.splitlines()
    rows, splits, inside = [], [], False
    for number, line in enumerate(lines, 1):
        if line.startswith('| variable |'):
            inside = True
        elif inside and line.startswith('| ---'):
            continue
        elif inside and line.startswith('|'):
            rows.append((number, _names(line.split('|')[1], spec)))
        elif inside:
            inside = False
            following = lines[number:number + 2]
            if line == '' and following and following[0].startswith('| `') and not (
                    len(following) > 1 and following[1].startswith('| ---')):
                splits.append(number)
    return rows, splits


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
    unnamed = sorted(name for name in spec if name not in listed and '`%s`' % name not in text)
    assert (twice, unknown, unnamed, splits) == ([], [], [], []), (
        'listed twice %s; listed but not in meta/argument_specs.yml %s; in the spec but named nowhere in '
        'the README %s; blank line inside a variable table at line(s) %s' % (twice, unknown, unnamed, splits))

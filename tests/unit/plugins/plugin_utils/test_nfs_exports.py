"""The exports parser against what the real exportfs (nfs-utils 2.6.2) did with each line,
and the cluster rules on top of it."""

import os
import re

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import nfs_exports as ne

FIXTURE = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'exportfs', 'nfs-utils-2.6.2-bookworm.txt')
CIDR = '10.213.116.0/24'


def recorded_cases():
    text = open(FIXTURE, encoding='utf-8').read()
    cases = []
    for block in re.split(r'^### ', text, flags=re.M)[1:]:
        head, rest = block.split('\n', 1)
        number, rc = re.match(r'(\d+) rc=(\d+)', head).groups()
        line = re.search(r'^LINE: (.*)$', rest, flags=re.M).group(1)
        message = rest.split('\n', 1)[1].split('ETAB:')[0].strip()
        etab = re.findall(r'(\S+)\t([^(\s]+)\(', rest.split('ETAB:')[1])
        cases.append((int(number), int(rc), line, message, etab))
    return cases


CASES = recorded_cases()
# exportfs failed on these because of the file system, not the syntax.
STAT_FAILURES = {28}


def test_fixture_was_read():
    assert len(CASES) == 40
    assert sum(1 for c in CASES if c[1] != 0) == 12


@pytest.mark.parametrize('number, rc, line, message, etab', [c for c in CASES if c[1] != 0 and c[0] not in STAT_FAILURES],
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_lines_exportfs_refused_are_refused_with_its_reason(number, rc, line, message, etab):
    with pytest.raises(ne.ExportsError) as err:
        ne.parse_line(line)
    # Same reason as exportfs: its message holds ours (minus the file:line prefix).
    assert str(err.value) in message, (number, str(err.value), message)


@pytest.mark.parametrize('number, rc, line, message, etab', [c for c in CASES if c[1] == 0 or c[0] in STAT_FAILURES],
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_lines_exportfs_accepted_are_read_as_exportfs_read_them(number, rc, line, message, etab):
    entry = ne.parse_line(line)
    # The same (path, client) pairs as exportfs wrote to its etab (which makes paths absolute
    # and writes a space as \\040).
    path = '/' + entry['path'].lstrip('/').replace(' ', '\\040')
    assert sorted((path, c['host']) for c in entry['clients']) == sorted(etab)


# What exportfs accepted but the cluster refuses, and why.
POLICY = {
    3: 'async may lose written data',
    4: 'no_root_squash lets root',
    15: 'root_squash and no_root_squash contradict',
    16: 'rw and ro contradict',
    17: 'sync and async contradict',
    19: 'a space before "(" exports these options to every host',
    22: '* exports to every host',
    26: 'name sync',
    27: 'export path srv/x is not absolute',
    2: None, 1: None, 5: None, 7: None, 8: None, 9: None, 11: None, 13: None,
}


@pytest.mark.parametrize('number, expected', sorted(POLICY.items()))
def test_cluster_policy_on_recorded_lines(number, expected):
    line = [c for c in CASES if c[0] == number][0][2]
    errors = ne.policy_errors(ne.parse_line(line), CIDR)
    if expected is None:
        assert errors == []
    else:
        assert any(expected in e for e in errors), errors


def test_space_before_parenthesis_is_read_as_exportfs_reads_it():
    entry = ne.parse_line('/srv/x 10.213.116.0/24 (rw,sync,no_subtree_check)')
    assert [c['host'] for c in entry['clients']] == ['10.213.116.0/24', '*']
    assert entry['clients'][1]['options'] == ['rw', 'sync', 'no_subtree_check']


def test_parse_exports_reports_line_numbers_and_skips_comments():
    text = ('# comment\n\n/srv/a 10.0.0.0/24(rw,sync,no_subtree_check)\n'
            '/srv/b 10.0.0.0/24(rw,bogus)\n/srv/c \\\n  10.0.0.0/24(ro,sync)\n')
    entries, errors = ne.parse_exports(text)
    assert [e['path'] for e in entries] == ['/srv/a', '/srv/c']
    assert errors == ['line 4: unknown keyword "bogus"']


@pytest.mark.parametrize('host, expected', [
    ('10.213.116.0/24', None),
    ('10.213.116.0/25', None),
    ('10.213.116.11', None),
    ('10.213.116.0/255.255.255.128', None),
    ('10.213.0.0/16', 'outside or wider than cluster_cidr'),
    ('10.213.117.0/24', 'outside or wider than cluster_cidr'),
    ('192.168.1.5', 'outside or wider than cluster_cidr'),
    ('fd00::/64', 'outside or wider than cluster_cidr'),
    ('*', 'exports to every host'),
    ('0.0.0.0/0', 'exports to every host'),
    ('*.lan', 'wildcard'),
    ('@trusted', 'netgroup'),
    ('gpu-worker-1', 'not an address or a network'),
])
def test_client_networks_must_lie_inside_cluster_cidr(host, expected):
    errors = ne.client_errors(host, CIDR)
    if expected is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expected in errors[0]


def test_outside_networks_need_the_explicit_opt_in_and_star_never_passes():
    assert ne.client_errors('192.168.1.0/24', CIDR, allow_outside=True) == []
    assert ne.client_errors('*', CIDR, allow_outside=True)


def test_export_options_add_sync_no_subtree_check_and_squash_once():
    assert ne.export_options(['rw']) == ['rw', 'sync', 'no_subtree_check', 'root_squash']
    assert ne.export_options(['rw', 'sync'], no_root_squash=True) == ['rw', 'sync', 'no_subtree_check', 'no_root_squash']


def test_rendered_line_round_trips_through_the_parser():
    line = ne.render_line('/shared', ['10.213.116.0/24'], ne.export_options(['rw']))
    assert line == '/shared 10.213.116.0/24(rw,sync,no_subtree_check,root_squash)'
    entry = ne.parse_line(line)
    assert entry['clients'] == [{'host': '10.213.116.0/24', 'detached': False,
                                 'options': ['rw', 'sync', 'no_subtree_check', 'root_squash']}]
    assert ne.policy_errors(entry, CIDR) == []


@pytest.mark.parametrize('path, clients, options, kwargs, expected', [
    ('/shared', [CIDR], ['rw'], {}, []),
    ('/shared', [CIDR], ['rw'], {'no_root_squash': True}, []),
    ('shared', [CIDR], ['rw'], {}, ["nfs_server_export_path: 'shared' is not an absolute path"]),
    ('/', [CIDR], ['rw'], {}, ['nfs_server_export_path: / would export the whole root file system']),
    ('/my share', [CIDR], ['rw'], {}, ["nfs_server_export_path: '/my share' holds a space, quote, # or backslash"]),
    ('/shared', ['*'], ['rw'], {}, ['nfs_server_export_clients: * exports to every host; name networks inside '
                                    'cluster_cidr 10.213.116.0/24']),
    ('/shared', ['10.0.0.0/8'], ['rw'], {}, ['nfs_server_export_clients: 10.0.0.0/8 is outside or wider than '
                                             'cluster_cidr 10.213.116.0/24']),
    ('/shared', ['10.0.0.0/8'], ['rw'], {'allow_outside': True}, []),
    ('/shared', [], ['rw'], {}, ['nfs_server_export_clients: is empty; name at least cluster_cidr']),
    ('/shared', [CIDR], ['rw', 'no_root_squash'], {}, [
        'nfs_server_export_options: no_root_squash is set with nfs_server_no_root_squash: true']),
    ('/shared', [CIDR], ['rw', 'async'], {}, [
        'nfs_server_export_options: async is decided by the role (it always renders sync and no_subtree_check)']),
    ('/shared', [CIDR], ['rw', 'ro'], {}, [
        'nfs_server_export_options: rw and ro contradict each other (exportfs would keep the last one)']),
    ('/shared', [CIDR], ['rw', 'xprtsec=tls'], {}, ['nfs_server_export_options: unknown keyword "xprtsec=tls"']),
    ('/shared', [CIDR], ['rw', 'root_squash'], {'no_root_squash': True}, [
        'nfs_server_export_options: root_squash and no_root_squash contradict each other (exportfs would keep the last one)']),
])
def test_export_errors_name_the_variable(path, clients, options, kwargs, expected):
    assert ne.export_errors(path, clients, options, CIDR, **kwargs) == expected

"""The layers of the collection's code, read from the source with ast (nothing is imported).

plugins/module_utils holds what a module ships to a node (its Ansiballz payload); plugins/plugin_utils
what only the controller runs (filters, the action, the lookup, the tests); roles/<role>/files/*.py the
programs a role installs on nodes (the supervisor, the pod agent, the examples, the smoke test), which
run without the collection: the standard library, their siblings and the one framework an example
trains with. See CONTRIBUTING.md.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(ROOT, 'plugins')
PREFIX = 'ansible_collections.gpucluster.multinode.plugins.'
CONTROLLER_KINDS = ('plugin_utils', 'filter', 'action', 'lookup', 'test')

# module_utils files no module reaches, each with the reason it is still there.
NOT_SHIPPED = {}

# Controller code that must never be in a module's payload.
CONTROLLER_ONLY = ('plugins/plugin_utils/',)

# The most module_utils files (and lines, all files together) each module ships. A module whose
# payload grows past its bound fails here: look at what it pulls in before raising the bound.
PAYLOAD_MAX = {
    'bandwidth': (5, 1210),  # an iperf3 client that printed nothing with exit 0 is tried again
    'collective': (8, 2100),
    'container_image_info': (4, 1600),  # containers.py quotes with training/commands.py (join, q)
    'deepspeed_ops': (2, 800),
    'gpu_facts': (1, 600),
    'health_probe': (8, 2300),
    'health_report': (4, 650),
    'hostfile': (2, 500),
    'k8s_manifests': (0, 0),
    'port_holders': (1, 600),
    'python_env_info': (1, 400),
    'ray_node': (3, 1400),
    'ray_preflight': (3, 1100),
    'ray_status': (1, 400),
    'slurm_drain': (1, 240),  # slurm.py also reads a requeued, held job (the supervised Slurm path)
    'smoke': (5, 1100),
    # the training package (module_utils/training/): rank_errors, the tracebacks of the status read; ranks
    # (training_progress's read): a status read takes the figures in the same pass, one payload on every node
    # where there were two; launchers: each launcher's rules of what its status result says (exit_codes,
    # failure_node, ended), which the controller's job_state reads; slurm requeue and release; the launchers'
    # own steps (Slurm's submit and hold, mpirun's daemons and their spawn); what sets a launcher apart in a
    # container or under a scheduler (container_per_rank, schedules, Slurm's partition check)
    # the first-step watch's last step line of a job that failed after its steps (failed at step N); health_reports
    # (monitor's gauge_lines; the whole module is shipped for it): the health checks' n/a status
    'training_job': (18, 6155),
    # rank_errors: the logs' tracebacks; flight_recorder: the stall verdict, the dump request; ranks: the
    # module's own read, which training_job's status makes too; monitor's bounded read of the progress files
    # (every header, this node's ends)
    'training_progress': (9, 2825),
    # monitor's read_node_log: the steps of a script that writes no progress file, from its logs; the same
    # health_reports, and report_html's n/a style; the earlier attempts' files (one loss curve an attempt); the
    # faults' table (the time each cost, from the attempts' steps); supervision's plan_restart serves the pod
    # agent too (a restart already decided, the minimum's name); the core holds the supervision loop (Loop), which
    # the report does not run: the core is one file, installed beside each supervisor; and the rule of a stalled
    # job (stall), which the controller's job state and pod 0 on Kubernetes share
    'training_report': (9, 3410),
}


def rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, '/')


def source_files(kind):
    return sorted(glob.glob(os.path.join(PLUGINS, kind, '**', '*.py'), recursive=True))


def _resolve(dotted):
    """The file of a dotted name under plugins/ (module or package), or None."""
    base = os.path.join(PLUGINS, *dotted.split('.'))
    if os.path.isfile(base + '.py'):
        return base + '.py'
    if os.path.isdir(base):
        init = os.path.join(base, '__init__.py')
        return init if os.path.isfile(init) else base
    return None


def collection_imports(path):
    """[(line, imported name, file or None)] of the collection's own imports in a file (function-level
    imports included); a name that is a package gives its directory."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = []
            for alias in node.names:
                # from package import module, else from module import name
                whole = '%s.%s' % (node.module, alias.name)
                found = whole.startswith(PREFIX) and _resolve(whole[len(PREFIX):]) is not None
                # a directory without __init__.py holds modules only: what is taken from it must be one
                package = node.module.startswith(PREFIX) and _resolve(node.module[len(PREFIX):])
                names.append(whole if found or (package and os.path.isdir(package)) else node.module)
        else:
            continue
        for name in names:
            if name.startswith(PREFIX):
                out.append((node.lineno, name, _resolve(name[len(PREFIX):])))
    return out


def other_imports(path):
    """[(line, name)] of every import of a file that is not the collection's own."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
    return [(line, name) for line, name in out if not name.startswith(PREFIX)]


def kind_of(path):
    return rel(path).split('/')[1]


def packages_of(path):
    """The __init__.py of each package a file under plugins/<kind>/ sits in (Ansiballz ships them with it)."""
    out, folder = [], os.path.dirname(path)
    while os.path.dirname(folder) != PLUGINS and folder.startswith(PLUGINS + os.sep):
        init = os.path.join(folder, '__init__.py')
        if os.path.isfile(init):
            out.append(init)
        folder = os.path.dirname(folder)
    return out


def payload(module_path):
    """{file: (importer, line)} of every collection file a module reaches through its imports, with the
    __init__.py of the packages they are in."""
    seen, todo = {}, [module_path]
    while todo:
        current = todo.pop()
        for line, name, target in collection_imports(current):
            if target and target not in seen and target != module_path:
                seen[target] = (rel(current), line, name)
                if os.path.isfile(target):
                    todo.append(target)
                for init in packages_of(target):
                    seen.setdefault(init, (rel(current), line, name))
    return seen


MODULES = source_files('modules')
MODULE_NAMES = [os.path.basename(p)[:-3] for p in MODULES]


def test_every_collection_import_names_a_file():
    broken = ['%s:%d imports %s, which is no file under plugins/' % (rel(path), line, name)
              for kind in ('modules', 'module_utils') + CONTROLLER_KINDS for path in source_files(kind)
              for line, name, target in collection_imports(path) if target is None]
    assert not broken, '\n'.join(broken)


def test_every_collection_import_outside_plugins_names_a_file():
    # the lab's filters, the roles' scripts, the tests, the scripts: a file moved between the layers
    # must not leave one of them importing its old place
    paths = [p for top in ('lab', 'roles', 'tests', 'scripts', 'benchmarks', 'molecule')
             for p in glob.glob(os.path.join(ROOT, top, '**', '*.py'), recursive=True)]
    broken = ['%s:%d imports %s, which is no file under plugins/' % (rel(path), line, name)
              for path in sorted(paths) for line, name, target in collection_imports(path) if target is None]
    assert not broken, '\n'.join(broken)


def test_module_utils_imports_no_controller_code():
    broken = []
    for path in source_files('module_utils'):
        for line, name, target in collection_imports(path):
            if name[len(PREFIX):].split('.')[0] in CONTROLLER_KINDS:
                broken.append('%s:%d imports %s (controller code; module_utils ships to the nodes)'
                              % (rel(path), line, name))
        for line, name in other_imports(path):
            if name.split('.')[0] == 'ansible' and not name.startswith('ansible.module_utils'):
                broken.append('%s:%d imports %s (the controller\'s ansible, absent on a node)' % (rel(path), line, name))
    assert not broken, '\n'.join(broken)


def test_every_module_utils_file_ships_with_a_module():
    reached = set()
    for module in MODULES:
        reached.update(rel(p) for p in payload(module))
    unreached = [rel(p) for p in source_files('module_utils') if rel(p) not in reached]
    unexplained = [p for p in unreached if p.split('/', 2)[2] not in NOT_SHIPPED]
    assert not unexplained, ('no module imports these module_utils files, directly or through module_utils; '
                             'controller-only code goes to plugins/plugin_utils (or name the file in NOT_SHIPPED '
                             'with the reason):\n' + '\n'.join(unexplained))
    stale = sorted(name for name in NOT_SHIPPED if 'plugins/module_utils/' + name not in unreached)
    assert not stale, 'NOT_SHIPPED names files that are gone or that a module now ships: %s' % ', '.join(stale)


def test_no_plugin_imports_a_filter():
    broken = ['%s:%d imports %s (a filter plugin; shared code goes to plugins/plugin_utils)' % (rel(path), line, name)
              for kind in ('modules', 'module_utils') + CONTROLLER_KINDS if kind != 'filter'
              for path in source_files(kind) for line, name, target in collection_imports(path)
              if name[len(PREFIX):].startswith('filter')]
    broken += ['%s:%d imports %s (another filter; shared code goes to plugins/plugin_utils)' % (rel(path), line, name)
               for path in source_files('filter') for line, name, target in collection_imports(path)
               if name[len(PREFIX):].startswith('filter')]
    assert not broken, '\n'.join(broken)


def test_the_bounds_name_every_module():
    assert sorted(PAYLOAD_MAX) == sorted(MODULE_NAMES)


@pytest.mark.parametrize('module', MODULES, ids=MODULE_NAMES)
def test_a_module_ships_no_controller_code_and_stays_within_its_bound(module):
    name = os.path.basename(module)[:-3]
    files = payload(module)
    controller = ['%s (%s:%d imports %s)' % ((rel(p),) + how) for p, how in sorted(files.items())
                  if rel(p).startswith(CONTROLLER_ONLY) or not rel(p).startswith('plugins/module_utils/')]
    assert not controller, '%s ships controller code:\n%s' % (name, '\n'.join(controller))
    lines = 0
    for path in files:
        with open(path) as handle:
            lines += len(handle.read().splitlines())
    most_files, most_lines = PAYLOAD_MAX.get(name, (0, 0))
    shown = '\n'.join('%s (%s:%d)' % (rel(p), how[0], how[1]) for p, how in sorted(files.items()))
    assert len(files) <= most_files and lines <= most_lines, (
        '%s ships %d module_utils files, %d lines (bound: %d files, %d lines):\n%s'
        % (name, len(files), lines, most_files, most_lines, shown))


TESTS = os.path.join(ROOT, 'tests', 'unit')


def layers_used(path):
    """The directories of plugins/ whose code a test file uses: imported, or named by path (a module run
    as Ansible runs it, e.g. os.path.join(ROOT, 'plugins', 'modules', 'hostfile.py'))."""
    used = {name[len(PREFIX):].split('.')[0] for _, name, _ in collection_imports(path)}
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            words = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            used.update(b for a, b in zip(words, words[1:]) if a == 'plugins')
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith('plugins/'):
            used.add(node.value.split('/')[1])
    return used


TRAINING_MODULES = ('training_job', 'training_progress', 'training_report')


def test_the_training_jobs_own_code_is_one_package():
    """What only the training modules ship lives in plugins/module_utils/training/ (the job's one home,
    CONTRIBUTING.md); a module_utils file outside it that they ship is one other modules ship too."""
    shipped_by = {}
    for module in MODULES:
        for path in payload(module):
            shipped_by.setdefault(rel(path), set()).add(os.path.basename(module)[:-3])
    assert all(m in MODULE_NAMES for m in TRAINING_MODULES)
    stray = sorted(path for path, users in shipped_by.items()
                   if path.startswith('plugins/module_utils/') and not path.startswith('plugins/module_utils/training/')
                   and users <= set(TRAINING_MODULES))
    assert not stray, 'only the training modules ship %s: move it to plugins/module_utils/training/' % ', '.join(stray)
    assert any(p.startswith('plugins/module_utils/training/') for p in shipped_by)


# The controller's plugins of a training job: they read the job's state and show it.
TRAINING_PLUGINS = ('filter/training.py', 'filter/training_monitor.py', 'filter/training_summary.py',
                    'action/training_job.py')


def test_the_controller_s_training_code_is_one_package():
    """What only the training plugins use on the controller lives in plugins/plugin_utils/training/ (the job's
    state, how it is shown, the waits, the summary): beside plugins/module_utils/training/, an import map
    shows training as one package on each side."""
    used_by = {}
    plugins = [p for kind in ('filter', 'action', 'lookup', 'test') for p in source_files(kind)]
    for plugin in plugins:
        for path in payload(plugin):
            used_by.setdefault(rel(path), set()).add(rel(plugin)[len('plugins/'):])
    assert all(os.path.isfile(os.path.join(PLUGINS, p)) for p in TRAINING_PLUGINS)
    stray = sorted(path for path, users in used_by.items()
                   if path.startswith('plugins/plugin_utils/') and not path.startswith('plugins/plugin_utils/training/')
                   and users <= set(TRAINING_PLUGINS))
    assert not stray, 'only the training plugins use %s: move it to plugins/plugin_utils/training/' % ', '.join(stray)
    decider = 'plugins/plugin_utils/training/job_state.py'
    assert set(TRAINING_PLUGINS[:2]) <= used_by.get(decider, set()), 'the training filters read the job\'s state in %s' % decider


def test_a_test_file_is_filed_under_the_layer_of_its_code():
    """tests/unit/plugins/<directory>/ holds the tests of plugins/<directory>: each file there uses code of
    that directory (a plugin_utils test may use module_utils to make its input, not the other way
    round). Tests of a role's scripts are under tests/unit/roles/<role>/."""
    wrong = []
    for path in sorted(glob.glob(os.path.join(TESTS, 'plugins', '*', 'test_*.py'))):
        layer = os.path.basename(os.path.dirname(path))
        used = sorted(layers_used(path))
        if layer not in used:
            wrong.append('%s uses no code of plugins/%s (it uses: %s); file it under the directory of the code '
                         'it tests' % (rel(path), layer, ', '.join(used) or 'nothing of plugins/'))
    for path in sorted(glob.glob(os.path.join(TESTS, 'roles', '*'))):
        if not os.path.isdir(os.path.join(ROOT, 'roles', os.path.basename(path))):
            wrong.append('%s names no role under roles/' % rel(path))
    assert not wrong, '\n'.join(wrong)


PROGRAMS = sorted(glob.glob(os.path.join(ROOT, 'roles', '*', 'files', '*.py')))
# What a program may import beyond the standard library and the programs beside it: the framework the
# job or task it is runs on.
PROGRAM_FRAMEWORKS = {
    'roles/training/files/train_tiny.py': {'torch', 'deepspeed'},
    'roles/training/files/train_fsdp.py': {'torch'},
    # the examples' helper: torch where the job has it (the flight recorder, TensorBoard's writer)
    'roles/training/files/gpucluster_progress.py': {'torch'},
    'roles/cluster_tests/files/smoke.py': {'torch'},
    'roles/cluster_tests/files/collective.py': {'torch'},
    'roles/ray/files/ray_hostnames.py': {'ray'},
}


# Modules of the training package a program (or a module of its files/ directory it imports) imports by their
# file's name: installed beside it (the training role copies __training_supervisor_files to the supervisor host;
# the k8s ConfigMap holds the core beside the pod agent and its parts). Each is standard library only.
CORE = 'plugins/module_utils/training/supervision.py'
BESIDE = {
    'roles/training/files/gpucluster_supervise.py': {'supervision': CORE,
                                                     'flight_recorder': 'plugins/module_utils/training/flight_recorder.py'},
    'roles/k8s/files/k8s_pod.py': {'supervision': CORE},
}
# Calls that load code from a path or by a computed name: an edge between the layers no import statement shows.
HIDDEN_LOADS = ('spec_from_file_location', 'import_module', '__import__', 'run_path', 'run_module', 'load_source',
                'SourceFileLoader', 'exec_module')
# A role's task or template that reaches out of its own directory (role_path/.., role_path | dirname), each
# with what it reaches: the only ones allowed.
OUT_OF_ROLE = {
    'roles/training/tasks/supervise_check.yml': 'the collection\'s modules in __training_supervisor_files',
    'roles/preflight/tasks/main.yml': "each step role's meta/argument_specs.yml and tasks/validate.yml",
}
OUT_OF_ROLE_RE = re.compile(r"role_path\s*(?:\}\}\s*/\s*\.\.|~\s*['\"]/\.\.|\|\s*dirname)")


def hidden_loads(path):
    """[(line, what)] of the calls of a file that load code from a path or a computed name."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
            if name in HIDDEN_LOADS:
                out.append((node.lineno, name))
        elif isinstance(node, ast.ImportFrom) and node.module in ('runpy', 'importlib', 'importlib.util', 'imp'):
            out += [(node.lineno, a.name) for a in node.names if a.name in HIDDEN_LOADS + ('util',)]
    return out


def test_no_code_that_ships_loads_code_by_path():
    """What the collection ships (its plugins, the roles' programs) reaches other code by import statements only,
    which these tests read: a load by path or by a computed name would be an edge nobody sees."""
    paths = source_files('') + PROGRAMS
    wrong = ['%s:%d %s' % (rel(path), line, what) for path in paths for line, what in hidden_loads(path)]
    assert not wrong, 'load code with an import statement (a program: a module installed beside it, BESIDE):\n' \
        + '\n'.join(wrong)
    # the check sees one: the tests' own conftest loads the programs' modules by path, as they are installed
    assert hidden_loads(os.path.join(ROOT, 'tests', 'conftest.py'))


def test_a_role_reaches_out_of_its_directory_only_where_declared():
    wrong, seen = [], set()
    for path in sorted(glob.glob(os.path.join(ROOT, 'roles', '*', '*', '**', '*'), recursive=True)):
        if not path.endswith(('.yml', '.yaml', '.j2')) or not os.path.isfile(path):
            continue
        with open(path) as handle:
            for number, line in enumerate(handle, 1):
                if OUT_OF_ROLE_RE.search(line):
                    seen.add(rel(path))
                    if rel(path) not in OUT_OF_ROLE:
                        wrong.append('%s:%d %s' % (rel(path), number, line.strip()))
    assert not wrong, ('a role reaches out of its directory (declare it in OUT_OF_ROLE with what it reaches, or '
                       'keep to the role):\n' + '\n'.join(wrong))
    assert seen == set(OUT_OF_ROLE), 'OUT_OF_ROLE names files that no longer reach out: %s' % (set(OUT_OF_ROLE) - seen)


def test_the_programs_installed_on_nodes_need_the_standard_library_only():
    """A program a role installs runs under the node's python3 (or the job's environment), where neither
    the collection nor Ansible is importable: it imports the standard library, its siblings under the
    same files/ directory, the framework listed above for it, and the training package's modules installed
    beside it (BESIDE)."""
    assert PROGRAMS, 'no program under roles/*/files'
    wrong = []
    for path in PROGRAMS:
        siblings = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(os.path.dirname(path), '*.py'))}
        allowed = set(sys.stdlib_module_names) | siblings | PROGRAM_FRAMEWORKS.get(rel(path), set()) | {'__future__'}
        allowed |= {name for program, modules in BESIDE.items() for name in modules
                    if os.path.dirname(program) == os.path.dirname(rel(path))
                    and os.path.basename(path) in program_closure(program)}
        for line, name in other_imports(path):
            if name.split('.')[0] not in allowed:
                wrong.append('%s:%d imports %s' % (rel(path), line, name))
        wrong += ['%s:%d imports %s' % (rel(path), line, name) for line, name, _ in collection_imports(path)]
    assert not wrong, '\n'.join(wrong)


def program_closure(program):
    """The file names of a program and of the siblings (its files/ directory's modules) it imports, and theirs."""
    folder = os.path.dirname(os.path.join(ROOT, program))
    siblings = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(folder, '*.py'))}
    seen, todo = set(), [os.path.basename(program)[:-3]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [imp.split('.')[0] for _, imp in other_imports(os.path.join(folder, name + '.py'))
                 if imp.split('.')[0] in siblings]
    return ['%s.py' % name for name in seen]


def test_the_modules_installed_beside_a_program_need_the_standard_library_only_and_are_installed_as_declared():
    """The modules a program imports by their file's name run where it runs (the supervisor host's python3, a
    pod's image): standard library only. The training role installs exactly the supervisor's (its program, its
    siblings and BESIDE's), and the pods' ConfigMap holds the core beside the pod agent."""
    wrong = []
    for program, modules in sorted(BESIDE.items()):
        folder = os.path.dirname(program)
        imported = {name for part in program_closure(program)
                    for _, name in other_imports(os.path.join(ROOT, folder, part))}
        for name, source in sorted(modules.items()):
            if name not in imported:
                wrong.append('%s does not import %s (BESIDE names it)' % (program, name))
            path = os.path.join(ROOT, source)
            wrong += ['%s:%d imports %s' % (source, line, imp) for line, imp in other_imports(path)
                      if imp.split('.')[0] not in set(sys.stdlib_module_names) | {'__future__'}]
            wrong += ['%s:%d imports %s' % (source, line, imp) for line, imp, _ in collection_imports(path)]
    assert not wrong, '\n'.join(wrong)
    import yaml
    with open(os.path.join(ROOT, 'roles', 'training', 'vars', 'main.yml')) as handle:
        installed = yaml.safe_load(handle)['__training_supervisor_files']
    supervisor = 'roles/training/files/gpucluster_supervise.py'
    assert sorted(installed) == sorted(program_closure(supervisor) + list(BESIDE[supervisor].values()))
    assert all(os.path.isfile(os.path.join(ROOT, p) if '/' in p else os.path.join(ROOT, 'roles', 'training', 'files', p))
               for p in installed)
    with open(os.path.join(ROOT, 'roles', 'training', 'tasks', 'supervise_check.yml')) as handle:
        assert 'loop: "{{ __training_supervisor_files }}"' in handle.read()
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
    with open(os.path.join(ROOT, CORE)) as handle:
        assert km.core_text() == handle.read() and kc.CORE == os.path.basename(CORE)
    # the ConfigMap mounts the pod entrypoint and exactly the parts it imports (and they import) beside it
    assert sorted((kc.ENTRYPOINT,) + kc.AGENT_MODULES) == sorted(program_closure('roles/k8s/files/k8s_pod.py'))
    assert set(km.agent_module_texts()) == set(kc.AGENT_MODULES)


def programs_used(path):
    """The roles whose programs a test file uses: imported by name, or named by path
    (os.path.join(..., 'roles', '<role>', 'files', ...) or 'roles/<role>/files/...')."""
    owner = {os.path.basename(p)[:-3]: rel(p).split('/')[1] for p in PROGRAMS}
    roles = {owner[name.split('.')[0]] for _, name in other_imports(path) if name.split('.')[0] in owner}
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            words = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            roles.update(b for a, b, c in zip(words, words[1:], words[2:]) if a == 'roles' and c == 'files')
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            roles.update(re.findall(r'(?:^|/)roles/([a-z_]+)/files/', node.value))
    return roles


def test_the_tests_of_a_program_are_filed_under_its_role():
    """A test that uses a program of roles/<role>/files and no code of plugins/ is a test of that
    program: it lives in tests/unit/roles/<role>/ (a test of plugins/ may run a program to make its input)."""
    wrong = []
    for path in sorted(glob.glob(os.path.join(TESTS, '**', 'test_*.py'), recursive=True)):
        if layers_used(path):
            continue
        roles = programs_used(path)
        here = rel(path).split('/')
        for role in sorted(roles):
            if here[:4] != ['tests', 'unit', 'roles', role]:
                wrong.append('%s tests roles/%s/files: move it to tests/unit/roles/%s/' % (rel(path), role, role))
    assert not wrong, '\n'.join(wrong)

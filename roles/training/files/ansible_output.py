# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What the supervisor reads of ansible's output: the error of a run (run_error: its last failing task's
fatal lines, or its ERROR!), the hosts where a run failed although they answered (failed_hosts), the answer of
each host of an ad-hoc run (parse_adhoc), and the fence run's counts. Pure functions of the text, standard
library only; installed beside the supervisor (the training role's __training_supervisor_files)."""

import json
import re


ERROR_CHARS = 400      # a run's error, cut to this


ANSI = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')


FATAL = re.compile(r'^fatal: \[(?P<host>[^\]]+)\]: (?P<caption>FAILED!|UNREACHABLE!) =>\s?(?P<rest>.*)$')


ERROR = re.compile(r'^(?:ERROR!|\[ERROR\]:)\s*(?P<msg>.*)$')


ADHOC = re.compile(r'^(?P<host>\S+) \| (?P<caption>SUCCESS|CHANGED|FAILED!?|UNREACHABLE!?)(?P<rest>.*)$')


NO_MATCH = re.compile(r'Could not match supplied host pattern, ignoring: (?P<host>\S+)')


def one_line(text, limit=ERROR_CHARS):
    """text on one line (runs of white space one space), cut to limit characters."""
    text = ' '.join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + '...'


def last_line(text):
    lines = [line for line in ANSI.sub('', text or '').splitlines() if line.strip()
             and not line.startswith(('[WARNING]', '[DEPRECATION WARNING]'))]
    return one_line(lines[-1]) if lines else 'no output'


def result_msg(lines):
    """The message of one result ansible printed (JSON on one or more lines, or YAML with
    callback_result_format=yaml): msg, with the module's stderr when the module itself failed."""
    text = '\n'.join(lines).strip()
    if text.startswith('{'):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            msg = data.get('msg') or ''
            msg = '; '.join(str(m) for m in msg) if isinstance(msg, list) else str(msg)
            for key in ('module_stderr', 'stderr'):
                extra = [x for x in str(data.get(key) or '').splitlines() if x.strip()]
                if extra and (not msg or 'MODULE FAILURE' in msg or 'non-zero return code' in msg
                              or 'deserialization' in msg):
                    msg = '%s: %s' % (msg, extra[-1]) if msg else extra[-1]
            return msg or text
        found = re.search(r'"msg":\s*"((?:[^"\\]|\\.)*)"', text)
        if found:
            try:
                return json.loads('"%s"' % found.group(1))
            except ValueError:
                return found.group(1)
        return text
    for i, line in enumerate(lines):
        found = re.match(r'^(\s*)msg:\s?(.*)$', line)
        if not found:
            continue
        indent, value = len(found.group(1)), found.group(2).strip()
        more = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            more.append(nxt.strip())
        if value in ('|', '|-', '|+', '>', '>-', '>+'):
            value = ' '.join(more)
        else:
            value = ' '.join([value] + more)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        return value
    return text


def clean_msg(msg):
    msg = one_line(msg, 100000)
    return msg[len('Task failed: '):] if msg.startswith('Task failed: ') else msg


def fatal_results(text):
    """[(line, task number, task, host, unreachable, msg)] of the fatal results in one ansible-playbook run's
    output (a host's FAILED! or UNREACHABLE!), those followed by ...ignoring left out."""
    lines = ANSI.sub('', text or '').splitlines()
    task, task_no, out = None, 0, []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('TASK ['):
            task_no += 1
            task = line[len('TASK ['):].rstrip('* ').rstrip()
            task = task[:-1] if task.endswith(']') else task
        found = FATAL.match(line)
        if not found:
            i += 1
            continue
        block, j = [found.group('rest')], i + 1
        while j < len(lines) and lines[j][:1] in (' ', '\t') and lines[j].strip():
            block.append(lines[j])
            j += 1
        if j >= len(lines) or lines[j].strip() != '...ignoring':  # an ignored one: its line is read next
            out.append((i, task_no, task, found.group('host'), found.group('caption') == 'UNREACHABLE!',
                        clean_msg(result_msg(block))))
        i = j
    return out


def failed_hosts(text):
    """{host: message} of the hosts a run failed on although they answered (FAILED!, not ignored; a host
    that was UNREACHABLE! is not one): the last message of each."""
    return dict((host, msg) for _, _, _, host, unreachable, msg in fatal_results(text) if not unreachable)


def run_error(text, limit=ERROR_CHARS):
    """The error of one ansible-playbook run's output, on one line cut to limit: the last failing task's
    fatal lines ('task "<name>": <hosts>: <msg>'; those followed by ...ignoring skipped), or the last
    ERROR! / [ERROR]: message after the last ignored failure, whichever came last; '' when none."""
    lines = ANSI.sub('', text or '').splitlines()
    fatals = [(i, task_no, task, host, ('unreachable: ' + msg) if unreachable else msg)
              for i, task_no, task, host, unreachable, msg in fatal_results(text)]
    errors, last_ignored = [], -1
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == '...ignoring':
            last_ignored = i
        found = ERROR.match(line)
        if found:
            block, j = [found.group('msg')], i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(('Origin:', 'fatal: [', 'TASK [')):
                block.append(lines[j])
                j += 1
            errors.append((i, one_line(' '.join(block), 100000)))
            i = j
            continue
        i += 1
    errors = [e for e in errors if e[0] > last_ignored]
    if fatals and (not errors or fatals[-1][0] > errors[-1][0]):
        last = fatals[-1][1]
        group = [f for f in fatals if f[1] == last]
        by_msg = []
        for _, _, _, host, msg in group:
            for entry in by_msg:
                if entry[1] == msg:
                    entry[0].append(host)
                    break
            else:
                by_msg.append(([host], msg))
        said = '; '.join('%s: %s' % (', '.join(hosts), msg) for hosts, msg in by_msg)
        return one_line(('task "%s": %s' % (group[-1][2], said)) if group[-1][2] else said, limit)
    if errors:
        return one_line(errors[-1][1], limit)
    return ''


def parse_adhoc(text, hosts):
    """{host: None (it answered) or why it failed} from the output of an `ansible` ad-hoc run, one line a
    host (-o: 'h | CHANGED | rc=0 | (stdout) ...', 'h | FAILED! => {...}', 'h | UNREACHABLE!: msg') or
    the minimal callback's blocks ('h | CHANGED | rc=0 >>', 'h | UNREACHABLE! => {' and the lines after
    it). A host the output does not name did not answer (not in the inventory, when ansible says so)."""
    lines = ANSI.sub('', text or '').splitlines()
    blocks = {}
    current = None
    for line in lines:
        found = ADHOC.match(line)
        if found:
            current = [found.group('caption'), found.group('rest'), []]
            blocks.setdefault(found.group('host'), []).append(current)
        elif current is not None and not line.startswith(('[WARNING]', '[DEPRECATION WARNING]')):
            current[2].append(line)
    unmatched = set(m.group('host') for m in (NO_MATCH.search(line) for line in lines) if m)
    error = run_error(text)
    out = {}
    for host in hosts:
        mine = blocks.get(host)
        if not mine:
            out[host] = ('not in the inventory (no host of that name)' if host in unmatched
                         else 'no answer in ansible\'s output' + (' (%s)' % error if error else ''))
            continue
        failing = [b for b in mine if b[0].startswith(('FAILED', 'UNREACHABLE'))]
        if not failing:
            out[host] = None
            continue
        said, bare = [], []
        for caption, rest, more in failing:
            kind = 'unreachable' if caption.startswith('UNREACHABLE') else 'failed'
            rest = rest.strip()
            if rest.startswith('=>'):
                msg = clean_msg(result_msg([rest[2:].strip()] + more))
                said.append('%s: %s' % (kind, msg))
            elif rest.startswith(':'):
                said.append('%s: %s' % (kind, clean_msg(rest[1:])))
            else:
                # a command's own failure: '| rc=1 | (stdout) ... (stderr) ...' or '| rc=1 >>' and its output
                detail = one_line(' '.join([rest.strip(' |').replace(' >>', '')] + more), 300)
                bare.append('%s: %s' % (kind, detail))
        unique = []
        for msg in said or bare:
            if msg not in unique:
                unique.append(msg)
        out[host] = one_line('; '.join(unique), 300)
    return out


def fenced_counts(text, hosts):
    """{host: processes killed} for the hosts the fence run reached (parse_adhoc), the others left out."""
    answers = parse_adhoc(text, hosts)
    out = {}
    for host in hosts:
        if answers.get(host) is None:
            found = re.search(r'^%s \|.*gpucluster-fenced (\d+)' % re.escape(host), text or '', re.M)
            out[host] = int(found.group(1)) if found else 0
    return out

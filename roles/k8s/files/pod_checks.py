# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What a pod can do and how its part ended: its capabilities and memlock limit (RDMA), whether it can write
the job's volume, a launcher's exit read (a signal, a rank killed by one), and the culprit among failed parts
(blame, in the supervision core's order). Standard library only; mounted beside the pod entrypoint."""

import os
import signal
import stat
import tempfile

import supervision


CAP_IPC_LOCK = 14


def capabilities(status_path='/proc/self/status'):
    """The effective capability set of this process (CapEff of /proc/self/status), 0 when unreadable."""
    try:
        with open(status_path) as handle:
            for line in handle:
                if line.startswith('CapEff:'):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def memlock():
    """(soft, hard) RLIMIT_MEMLOCK in bytes, -1 for unlimited."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError):
        return (0, 0)
    inf = getattr(resource, 'RLIM_INFINITY', -1)
    return tuple(-1 if v == inf else v for v in (soft, hard))


def claim_check(path):
    """Whether this process can write the job's volume at path (a file made and removed: os.access is
    not what NFS answers): {writable, path, owner, gid, why}."""
    if not path:
        return {'writable': True, 'path': ''}
    try:
        st = os.stat(path)
    except OSError as exc:
        return {'writable': False, 'path': path, 'owner': '?', 'gid': None, 'why': exc.strerror or str(exc)}
    out = {'writable': True, 'path': path, 'gid': st.st_gid,
           'owner': 'owner %d:%d, mode %04o' % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))}
    try:
        handle, name = tempfile.mkstemp(prefix='.gpucluster-write-check-', dir=path)
        os.close(handle)
        os.unlink(name)
    except OSError as exc:
        out.update(writable=False, why=exc.strerror or str(exc))
    return out


def claim_verdict(job, pod, hello):
    """'' where the pod's agent can write the job's volume, else why and what to set."""
    claim = hello.get('claim') or {}
    if claim.get('writable', True):
        return ''
    gid = claim.get('gid')
    groups = ','.join(str(g) for g in hello.get('groups') or []) or '-'
    return ('pod %s (uid %s, gid %s, groups %s) cannot write the claim %s at %s (%s: %s); fsGroup %s was not '
            'applied to it (NFS, CephFS and most ReadWriteMany drivers ignore fsGroup): set '
            'security.supplemental_groups: [%s] (the group that owns it) in the cluster file, or have an '
            'administrator make its root writable by uid %s once' % (
                pod, hello.get('uid'), hello.get('gid'), groups, job.get('claim', '?'), claim.get('path'),
                claim.get('owner', '?'), claim.get('why', '?'),
                job.get('fs_group') if job.get('fs_group') is not None else '(none set)',
                gid if gid not in (None, 0) else '<its gid>', hello.get('uid')))


def rdma_verdict(hello):
    """'' when a pod can register (pin) RDMA memory: IPC_LOCK effective or an unlimited memlock limit."""
    cap = int(hello.get('cap_eff', '0'), 16)
    soft = hello.get('memlock', [0, 0])[0]
    if cap & (1 << CAP_IPC_LOCK) or soft == -1:
        return ''
    return ('cannot register RDMA memory: memlock limit %s and IPC_LOCK not effective (CapEff %s); the '
            'runtime did not give the added capability to this uid: ask for an unlimited memlock limit on '
            'the node (containerd/CRI-O default_ulimits) or a runtime that grants ambient capabilities'
            % ('%d KiB' % (soft // 1024), hello.get('cap_eff')))


def describe_exit(status):
    """(exit_code, reason) of a waitpid status; a signal is a negative code as subprocess has it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = 'signal %d' % sig
        reason = 'killed by %s' % name
        if sig == signal.SIGKILL:
            reason += ' (an out-of-memory kill does this)'
        return -sig, reason
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255
    if code == 0:
        return 0, 'exit 0'
    reason = 'exit %d' % code
    sig = rank_signal(code)
    if sig:
        reason += ' (a rank was killed by %s%s)' % (sig.name, ': an out-of-memory kill does this'
                                                    if sig == signal.SIGKILL else '')
    return code, reason


def rank_signal(code):
    """The signal that killed a rank, read from its launcher's exit code: 128+N from a shell, 256-N
    from DeepSpeed's launcher (sys.exit of the rank's negative return code); None otherwise."""
    for number in ((code - 128) if 128 < code <= 128 + 64 else None, (256 - code) if 192 < code <= 255 else None):
        if number:
            try:
                return signal.Signals(number)
            except ValueError:
                pass
    return None


def blame(states):
    """The pod whose part is the cause among failed parts, in the supervision core's order
    (supervision.CULPRIT_ORDER): a restarted container first, then a pod that cannot be reached, a rank
    killed by a signal, any other failure, a part stopped by someone (not by this job's own stop); the
    earliest ended among equals. Returns (pod, reason) or None."""
    entries = []
    for st in states:
        state, reason = st.get('state'), st.get('reason') or ''
        if state == 'absent':
            reason = 'has no part of the job (its container started again without its state?)'
        elif state == 'unreachable':
            reason = 'unreachable (%s)' % st.get('error', '')
        elif state == 'failed':
            reason = reason or 'exit %s' % st.get('exit_code')
        elif state == 'stopped' and not reason.startswith('stopped: pod '):
            reason = reason or 'stopped'
        else:
            continue
        kind = 'stopped' if state == 'stopped' else supervision.failure_kind(dict(st, reason=reason))
        entries.append({'node': st['pod'], 'kind': kind, 'ended': st.get('ended') or 0, 'why': reason})
    ordered = supervision.order_culprits(entries)
    return (ordered[0]['node'], ordered[0]['why']) if ordered else None

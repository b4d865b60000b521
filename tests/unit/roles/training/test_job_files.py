"""The job's files as root writes and reads them (roles/training/files/gpucluster_progress.py's write_atomic,
open_regular, read_regular; the supervisor's figures and glances): the supervisor runs as root and the
training account writes training_metrics_dir, the job's directory and the checkpoint directory. A link
planted there is never followed, a name never truncated or chmodded, a FIFO never waited on."""

import os
import socket
import stat
import sys
import threading

import pytest

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_progress as gp  # noqa: E402
import supervisor_driver as sdriver  # noqa: E402
import supervisor_glance as sglance  # noqa: E402

SECRET = 'root only\n'


@pytest.fixture
def canary(tmp_path):
    """A file only its owner may read (0600), outside the directory the training account writes."""
    path = tmp_path / 'canary'
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


def untouched(canary):
    return canary.read_text() == SECRET and stat.S_IMODE(canary.stat().st_mode) == 0o600


def settings(tmp_path, metrics):
    state = tmp_path / 'state'
    state.mkdir()
    return {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(state), 'nodes': ['head'],
            'restarts': 1, 'min_nodes': 1, 'seconds': 60, 'interval': 1, 'metrics_dir': str(metrics)}


# ----- writes -----------------------------------------------------------------------------------
def test_the_supervisors_figures_follow_no_link_the_training_account_plants_in_its_metrics_dir(tmp_path, canary):
    metrics = tmp_path / 'metrics'
    metrics.mkdir()
    name = 'gpucluster_supervisor_j-1.prom'
    # every name a writer of this collection made its temporary file under, and the destination itself
    planted = ['.%s.%d.tmp' % (name, os.getpid()), '%s.tmp.%s.%d' % (name, socket.gethostname(), os.getpid()),
               '%s.tmp%d' % (name, os.getpid()), '%s.%d.tmp' % (name, os.getpid()), name + '.tmp', name]
    for link in planted:
        os.symlink(str(canary), str(metrics / link))
    sup = sdriver.Supervisor(settings(tmp_path, metrics))
    sup.write_metrics(1764000000.0)
    assert untouched(canary)
    out = metrics / name
    assert not out.is_symlink() and stat.S_IMODE(out.stat().st_mode) == 0o644
    assert 'gpucluster_supervisor_heartbeat_timestamp_seconds{job="j-1"} 1764000000.0' in out.read_text()
    # the links planted at the temporary names are left as they were: nothing was opened through them
    assert sorted(p for p in os.listdir(str(metrics)) if os.path.islink(str(metrics / p))) == sorted(planted[:-1])


def test_the_temporary_name_is_random_and_a_link_planted_at_it_is_refused_not_followed(tmp_path, canary, monkeypatch):
    folder = tmp_path / 'ckpt'
    folder.mkdir()
    (folder / 'latest').write_text('step10\n')
    names = []
    real = os.urandom

    def urandom(n):
        names.append(real(n))
        return names[-1]

    monkeypatch.setattr(gp.os, 'urandom', urandom)
    gp.write_atomic(str(folder / 'latest'), 'step20\n')
    gp.write_atomic(str(folder / 'latest'), 'step30\n')
    assert len(names) == 2 and names[0] != names[1] and len(names[0]) == 8
    assert (folder / 'latest').read_text() == 'step30\n' and os.listdir(str(folder)) == ['latest']
    # a name planted at the very one the writer draws: O_EXCL | O_NOFOLLOW refuses it, nothing is written
    monkeypatch.setattr(gp.os, 'urandom', lambda n: b'\x01' * n)
    os.symlink(str(canary), str(folder / ('.latest.%s.tmp' % ('01' * 8))))
    with pytest.raises(OSError):
        gp.write_atomic(str(folder / 'latest'), 'step40\n')
    assert untouched(canary) and (folder / 'latest').read_text() == 'step30\n'
    assert os.path.islink(str(folder / ('.latest.%s.tmp' % ('01' * 8))))


# ----- reads --------------------------------------------------------------------------------------
def returns_within(seconds, call, fifos):
    """call()'s value, asserting it came within seconds; a reader left waiting on one of the FIFOs is let go."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault('value', call()), daemon=True)
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    for fifo in fifos:
        try:
            os.close(os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    thread.join(5)
    assert not hung, '%s waited on a FIFO' % call
    return box.get('value')


def test_the_job_files_root_reads_are_never_a_fifo_waited_on(tmp_path):
    job, ckpt = tmp_path / 'job', tmp_path / 'ckpt'
    for folder in (job / 'progress', job / 'exit', ckpt / 'step10'):
        folder.mkdir(parents=True)
    fifos = [job / 'progress' / 'rank-0.log', job / 'exit' / 'head', ckpt / 'latest', ckpt / 'ATTEMPT',
             ckpt / 'step10' / gp.CHECKPOINT_DONE]
    for fifo in fifos:
        os.mkfifo(str(fifo))
    assert returns_within(5, lambda: gp.rank_file_marks(str(fifos[0])), fifos) is None
    assert returns_within(5, lambda: sglance.read_exit_codes(str(job), ['head']), fifos) == {}
    assert returns_within(5, lambda: gp.latest_complete_checkpoint(str(ckpt))[0], fifos) is None
    assert returns_within(5, lambda: gp.checkpoint_claim(str(ckpt)), fifos) == (None, None)
    assert returns_within(5, lambda: gp.resume_point(str(ckpt))['complete'], fifos) is False


def test_the_job_files_root_reads_follow_no_link_and_stop_at_their_bound(tmp_path):
    ckpt = tmp_path / 'ckpt'
    (ckpt / 'step10').mkdir(parents=True)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.write_text('# gpucluster-progress rank=0 host=head attempt=1 time=1\nstep=5 loss=1 time=2\n')
    os.symlink(str(elsewhere), str(ckpt / 'latest'))
    os.symlink(str(elsewhere), str(tmp_path / 'rank-0.log'))
    assert gp.rank_file_marks(str(tmp_path / 'rank-0.log')) is None
    assert gp.latest_complete_checkpoint(str(ckpt))[0] is None
    # a tag is a name in the checkpoint directory, never a path out of it
    os.unlink(str(ckpt / 'latest'))
    (tmp_path / 'out').mkdir()
    gp.commit_checkpoint(str(tmp_path), 'out', 7, 1)
    (ckpt / 'latest').write_text('../out\n')
    assert gp.latest_complete_checkpoint(str(ckpt))[0] is None
    # a file larger than anyone writes there is read up to the bound only (a sparse 1 GiB here)
    with open(str(ckpt / 'latest'), 'wb') as handle:
        handle.truncate(1 << 30)
    assert len(gp.read_regular(str(ckpt / 'latest'))) == gp.READ_MAX

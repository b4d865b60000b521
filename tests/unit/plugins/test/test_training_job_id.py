"""The job_id test (plugins/test/training.py): train.yml's check of training_job_id, the training_job
module's own rule (module_utils/training/commands.py), so the two never disagree."""

from __future__ import annotations

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as training
from ansible_collections.gpucluster.multinode.plugins.test import training as training_tests

JOB_ID = training_tests.TestModule().tests()['job_id']


@pytest.mark.parametrize('job_id', ['tiny-001', 'train_tiny-20261127-101500', 'v1.2', 'a..b', 'A', 'x' * 64])
def test_a_plain_name_is_a_job_id(job_id):
    assert JOB_ID(job_id)
    assert training.check_job_id(job_id) == job_id


@pytest.mark.parametrize('job_id', ['', '.', '..', '../x', 'x/..', 'a/b', '/shared/jobs/x', '.hidden', '-x', '_x',
                                    'a b', 'a;rm -rf', 'x' * 65, 'tiny\n', 'tïny'])
def test_a_path_or_odd_text_is_no_job_id_for_the_playbook_nor_the_module(job_id):
    assert not JOB_ID(job_id)
    with pytest.raises(training.TrainingError, match='must be 1-64 letters, digits'):
        training.check_job_id(job_id)


def test_only_text_is_a_job_id():
    assert not JOB_ID(7) and not JOB_ID(None) and not JOB_ID(['x'])

# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Jinja tests of the training role: ``training_job_id is gpucluster.multinode.job_id``, a job id that is a
plain name (module_utils/training/commands.py's rule, the one the training_job module applies): never '.', '..'
or a path, since it names the job's directory under training_jobs_dir; ``training_progress_regex is
gpucluster.multinode.python_regex``, a string Python's re compiles (the nodes search the logs with it)."""

from __future__ import annotations

import re

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as training


def is_python_regex(value):
    """True for a string Python's re module compiles."""
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except (re.error, OverflowError, RecursionError):
        return False
    return True


class TestModule:
    def tests(self):
        return {
            'job_id': training.is_job_id,
            'python_regex': is_python_regex,
        }

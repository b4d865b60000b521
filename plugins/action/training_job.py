# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Action of gpucluster.multinode.training_job: the module on the node (see plugins/modules/training_job.py).

Its two waits (state first_step and finished) run in slices of progress_seconds, with a line on the
controller after each (plugin_utils/training/job_wait.py): a long wait says how it goes instead of staying
silent. Every other state is the module, unchanged."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_wait

display = Display()
MODULE = 'gpucluster.multinode.training_job'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        host = (task_vars or {}).get('inventory_hostname', '')

        def call(module_args):
            return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)

        def say(line):
            display.display('  [%s] %s' % (host, line) if host else '  ' + line)

        if args.get('state', 'started') in job_wait.WAITS:
            result.update(job_wait.run_wait(args, call, say))
        else:
            result.update(call(args))
        return result

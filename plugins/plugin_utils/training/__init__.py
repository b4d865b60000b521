# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A training job on the controller: its state decided from every node's read (job_state), how it is shown
(job_view), the first failing rank's own error (rank_failure), the long waits of a start or a watch
(job_wait) and the summary a start ends with (job_summary). The training filters and the training_job
action use them; the job's code on the nodes is the package plugins/module_utils/training/. Nothing here is
shipped to a node."""

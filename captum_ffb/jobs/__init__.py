"""Where batches run: the local backend (default) and, as an optional extra, Ray.

A corpus job (the paper's analyses, the faithfulness evaluation, explaining a corpus) is a
:class:`Job`: a fingerprint of its settings and data, a deterministic plan of batches, a
``setup`` that loads the model once per worker, and ``run_batch`` that turns one batch into
one shard (a dict of numpy arrays). ``run_job()`` writes each shard atomically as soon as
it is done and skips the shards already on disk, so an interrupted run resumes where it
stopped and no batch is counted twice; every backend writes the same shards, so the
aggregate does not depend on where the batches ran.
"""

from captum_ffb.jobs.job import ENGINES, Job, ModelSource, check_run, run_job
from captum_ffb.jobs.players import PlayerSplitJob, attribute_split
from captum_ffb.jobs.shards import ShardStore

__all__ = ["ENGINES", "Job", "ModelSource", "PlayerSplitJob", "ShardStore", "attribute_split", "check_run",
           "run_job"]

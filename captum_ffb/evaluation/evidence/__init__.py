r"""Faithfulness against ground truth: next-token predictions whose evidence is annotated.

Each example is a prefix, a grammatical and an ungrammatical next word, and the word of the
prefix that decides between them (BLiMP agreement and licensing, indirect object
identification; see ``data/evidence/README.md``). A method explains the contrast
``logit(good) − logit(bad)`` at the prefix's last position (the first token of each word, with
its leading space); only pairs the model gets right are scored. A faithful method ranks the
evidence first, whatever its position: every table holds the position-only controls
(``recency``, ``previous_token``, ``first_token``) and ``random`` beside the methods.

Scores per example (the evidence word may span several tokens: its best-ranked piece counts):

* **reciprocal rank** of the evidence (ties count at their mean rank, so a constant scores
  what a random order would on average), its mean over examples the **MRR**;
* **top-1**: the evidence ranked first, alone;
* **share**: ``Σ_evidence |a_j| / Σ_j |a_j|``, the part of the attribution's mass on it;
* **distance**: tokens between the evidence's last piece and the prediction (0: the
  evidence is the token just before it).

The copy task (:func:`~captum_ffb.evaluation.copy_task.copy_task`) joins as the subset
``copy``: random token sequences repeated at controlled distances, the evidence the answer's
earlier occurrence, the contrast ``logit(answer) − logit(the token that followed it)``.

The package is split as the perturbation evaluation is: :mod:`~.data` (the CSVs, the bundled
subsets and their splits, tokenised examples, the copy task's), :mod:`~.task` (what is
explained: :class:`EvidenceTask`), :mod:`~.metrics` (reciprocal ranks and the summary),
:mod:`~.job` (:class:`EvidenceJob` and :func:`evaluate_evidence`) and :mod:`~.report` (the
result files); every name is importable from here.
"""

from captum_ffb.evaluation.evidence.data import (
    COLUMNS,
    COPY_LENGTHS,
    EVIDENCE_DIR,
    SPLITS,
    EvidenceExample,
    EvidenceRow,
    bundled_subsets,
    copy_examples,
    evidence_example,
    in_split,
    read_evidence,
    select_evidence,
)
from captum_ffb.evaluation.evidence.job import DEFAULT_METHODS, EvidenceJob, evaluate_evidence
from captum_ffb.evaluation.evidence.metrics import (
    DISTANCE_BUCKETS,
    reciprocal_ranks,
    summarise_evidence,
)
from captum_ffb.evaluation.evidence.report import (
    SHORT,
    distance_table,
    evidence_table,
    write_evidence_report,
)
from captum_ffb.evaluation.evidence.task import EvidenceTask

__all__ = [
    "COLUMNS",
    "COPY_LENGTHS",
    "DEFAULT_METHODS",
    "DISTANCE_BUCKETS",
    "EVIDENCE_DIR",
    "SHORT",
    "SPLITS",
    "EvidenceExample",
    "EvidenceJob",
    "EvidenceRow",
    "EvidenceTask",
    "bundled_subsets",
    "copy_examples",
    "distance_table",
    "evaluate_evidence",
    "evidence_example",
    "evidence_table",
    "in_split",
    "read_evidence",
    "reciprocal_ranks",
    "select_evidence",
    "summarise_evidence",
    "write_evidence_report",
]

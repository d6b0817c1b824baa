r"""The estimators of patching effects: each estimates what activation patching measures,
``effect(A) = output(clean) − output(clean with A's output taken from the corrupted run)``,
from a few passes instead of one patched pass per component, for every node of a graph at
once (and, for some, for its edges).

One module per estimator, each a registered :class:`Estimator` (its name, citation, cost in
model passes, and whether it estimates edges):

* ``frozen.py``, :class:`Frozen` (``"frozen"``): the frozen model's gradient;
* ``atp.py``, :class:`AtP` (``"atp"``): attribution patching (Nanda 2023; Syed et al. 2023,
  arXiv:2310.10348);
* ``relp.py``, :class:`RelP` (``"relp"``): relevance patching (Rezaei Jafari et al. 2025,
  arXiv:2508.21258);
* ``eap_ig.py``, :class:`EAPIG` (``"eap-ig"``): EAP-IG (Hanna et al. 2024, arXiv:2403.17806);
* ``gim.py``, :class:`GIM` (``"gim"``): Gradient Interaction Modifications (Edin et al. 2025,
  arXiv:2505.17630), and :class:`GIMIG` (``"gim-ig"``): its gradients along EAP-IG's path;
* ``atpstar.py``, :class:`AtPStar` (``"atp*"``) and :class:`QKFix` (its QK fix alone,
  ``"atp+qk"``): AtP* (Kramár et al. 2024, arXiv:2403.00745);
* ``exact.py``: the ``"+exact"`` variant of each linear one (:func:`exact_variant`: the nodes
  whose patch moves the stream most patched for real);
* ``verified.py``: the ``"+verify"`` variant (:func:`verified_variant`, ``"atp+verify"``: the
  components the estimates flag most patched for real, AtP*'s second stage).

What they share: ``recorded.py`` (the recorded passes: :func:`record`, :func:`differences`,
:func:`gradients`), ``base.py`` (the protocol, the :class:`Shared` state, the registry) and
``edges.py`` (the edges: :func:`edge_estimates`). A new estimator is one module: a class
registered with :func:`register_estimator`.
"""

from captum_ffb.patching.estimators.base import (
    EAP_IG_STEPS,
    Estimate,
    Estimator,
    Shared,
    computation_order,
    estimator_aliases,
    estimator_names,
    get_estimator,
    record_shared,
    register_estimator,
    unregister_estimator,
)
from captum_ffb.patching.estimators.edges import (
    Link,
    edge_estimates,
    edge_estimator_names,
    link_of,
    link_values,
    writer_key,
)
from captum_ffb.patching.estimators.exact import exact_variant, kappas, node_kind
from captum_ffb.patching.estimators.recorded import (
    Differences,
    Probe,
    Recorded,
    differences,
    gradients,
    linear_estimates,
    record,
)
from captum_ffb.patching.estimators.verified import verified_variant, verify_scores

# isort: off
# the estimators, each registered as its module is imported, in the order their names are listed
from captum_ffb.patching.estimators.frozen import Frozen
from captum_ffb.patching.estimators.atp import AtP
from captum_ffb.patching.estimators.relp import GradientAttention, RelP, relp_rules
from captum_ffb.patching.estimators.eap_ig import EAPIG, eap_ig_gradients
from captum_ffb.patching.estimators.gim import GIM, GIMIG, GIMAttention, gim_rules
from captum_ffb.patching.estimators.atpstar import AtPStar, QKFix, StarEstimates, atp_star
# isort: on

__all__ = ["AtP", "AtPStar", "Differences", "EAPIG", "EAP_IG_STEPS", "Estimate", "Estimator",
           "Frozen", "GIM", "GIMAttention", "GIMIG", "GradientAttention", "Link", "Probe", "QKFix",
           "Recorded", "RelP", "Shared", "StarEstimates", "atp_star", "computation_order",
           "differences", "eap_ig_gradients", "edge_estimates", "edge_estimator_names",
           "estimator_aliases", "estimator_names", "exact_variant", "get_estimator", "gim_rules",
           "gradients", "kappas", "linear_estimates", "link_of", "link_values", "node_kind",
           "record", "record_shared", "register_estimator", "relp_rules", "unregister_estimator",
           "verified_variant", "verify_scores", "writer_key"]

"""Integrations with other tools, loaded only on request (their dependencies are optional).

- :mod:`captum_ffb.integrations.inseq`: ``register()`` adds ``"norm_decomposition"`` and
  ``"norm_decomposition_forward"`` to inseq's attribution methods.
- :mod:`captum_ffb.integrations.gradio_app`: ``build_app`` and ``launch``, a local Gradio app
  (``captum-ffb app``; ``pip install "captum_ffb[app]"``).
- :mod:`captum_ffb.integrations.ferret`: ``NormDecompositionExplainer`` for ferret's
  ``Benchmark``, ``ReadOutClassifier`` (a base model and a read-out as the classifier ferret
  calls), tables that work under pandas 3, ``benchmark_texts``.
- :mod:`captum_ffb.integrations.lit`: ``build_app()`` and ``serve()`` run LIT with our
  salience interpreters (NormDecomposition, the layer maps) next to LIT's own; the LIT
  classes themselves (models, dataset, interpreters) for your own LIT server.
"""

"""The decomposition as inseq attribution methods.

``register()`` makes ``inseq.load_model(model, "norm_decomposition")`` (and
``"norm_decomposition_forward"``) work. It is explicit rather than done by ``import
captum_ffb`` because inseq is an optional dependency (``pip install "captum_ffb[inseq]"``)
whose import takes seconds and which registers its own methods globally: nothing of it is
loaded until you ask.
"""

from __future__ import annotations

#: The names ``register()`` adds to inseq's attribution methods.
METHOD_NAMES = ("norm_decomposition", "norm_decomposition_forward")


def register() -> tuple[str, ...]:
    r"""Register the decomposition's methods with inseq (idempotent).

    Returns:
        tuple[str, ...]: the method names, for ``inseq.load_model(model, name)``.

    Examples::

        >>> import inseq
        >>> from captum_ffb.integrations import inseq as ffb_inseq
        >>> ffb_inseq.register()
        ('norm_decomposition', 'norm_decomposition_forward')
        >>> model = inseq.load_model(hf_model, "norm_decomposition", tokenizer=tokenizer)
        >>> model.attribute("The capital of France is").show()
    """
    try:
        import inseq  # noqa: F401
    except ImportError as error:
        raise ImportError("the inseq integration needs inseq: pip install 'captum_ffb[inseq]'") from error
    from captum_ffb.integrations import _inseq_methods  # noqa: F401  (defining the classes registers them)

    return METHOD_NAMES


__all__ = ["METHOD_NAMES", "register"]

"""Long contexts: which part of a long input (a paragraph, a sentence, a retrieved document)
an answer rests on, exactly (:func:`context_attribution`)."""

from captum_ffb.long_context.attribution import ContextAttribution, context_attribution

__all__ = ["ContextAttribution", "context_attribution"]

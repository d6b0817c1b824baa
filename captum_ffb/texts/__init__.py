"""Texts in, numbers out: one text's maps (:mod:`~captum_ffb.texts.text`), reading texts and
datasets (:mod:`~captum_ffb.texts.corpus`), and numbers over maps
(:mod:`~captum_ffb.texts.stats`)."""

"""What is explained: the model loaded from a folder (:mod:`~captum_ffb.explained.models`),
the scalar read out of its output (:mod:`~captum_ffb.explained.readouts`) and the result
handed back (:mod:`~captum_ffb.explained.results`)."""

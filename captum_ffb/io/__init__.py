"""Files and pages out: atomic writes and strict JSON (:mod:`captum_ffb.io.files`), the page
skeleton and its escaping (``captum_ffb.io.pages``)."""

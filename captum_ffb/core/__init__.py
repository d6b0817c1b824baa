"""The lowest floor: the one vocabulary of ids, the tested versions and the decomposition
types every other floor speaks. Nothing here imports torch at import time but
:mod:`captum_ffb.core.decomposition`."""

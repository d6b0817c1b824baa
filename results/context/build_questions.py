"""The long-document question set of the ContextCite comparison: ``questions.json`` here.

Run from the repository root (a few minutes on two cores; SmolLM2-135M-Instruct)::

    python results/context/build_questions.py

**Documents**: six texts of 800–1,250 tokens (SmolLM2's tokenizer) cut from files that ship
with Python and two installed packages, each named with its licence in ``questions.json`` and
``README.md``: the history of Python, the PSF License, the CNRI License and the BeOpen and CWI
licences (CPython's ``LICENSE.txt``), SymPy's README (its package metadata) and three of
scikit-learn's data-set descriptions (``sklearn/datasets/descr``). Each is kept verbatim, its
reference lists cut. The sources are its sentences (``split_context(..., "sentence")``).

**Questions**: written by hand, each with the start of the assistant's reply (``lead``) and the
answer that follows it, and a piece of text (``evidence``) that states the fact: the builder
checks that the evidence lies in one paragraph, and the answer in that paragraph. Answers of
one token and of several (with SmolLM2's tokenizer, a leading space included).

**Kept** (the rule was fixed before any attribution was computed, and nothing is tuned on the
kept set): the answer's log-probability with the whole document is at least ``log 10`` above
its log-probability with an empty context (the document raises the answer's probability at
least tenfold) and the answer's first token is the model's greedy choice after the lead. The
others are listed with the reason they were dropped.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAIN = math.log(10)

#: (id, question, lead, answer, evidence)
QUESTIONS = {
    "python-history": [
        ("What language was Python created as a successor of?",
         "Python was created as a successor of a language called", " ABC", "a language called ABC"),
        ("In which country is CWI, where Python was created?",
         "Python was created at CWI in the", " Netherlands", "in the Netherlands"),
        ("In which month of 2000 did the Python core development team move to BeOpen.com?",
         "The Python core development team moved to BeOpen.com in", " May", "In May 2000"),
        ("In which month did the PythonLabs team move to Digital Creations?",
         "The PythonLabs team moved to Digital Creations in", " October", "In October of the same year"),
        ("Who is Python's principal author?", "Python's principal author is", " Guido",
         "Guido remains Python's principal author"),
        ("Where did Guido continue his work on Python in 1995?",
         "In 1995, Guido continued his work on Python at the", " Corporation for National Research Initiatives",
         "continued his work on Python at the Corporation for National Research Initiatives"),
        ("In which town was CNRI?", "CNRI was in", " Reston, Virginia", "in Reston, Virginia"),
        ("Which company did the PythonLabs team move to?", "The PythonLabs team moved to",
         " Digital Creations", "the PythonLabs team moved to Digital Creations"),
        ("What did Digital Creations become?", "Digital Creations became", " Zope Corporation",
         "which became Zope Corporation"),
        ("According to whom is Python 1.6.1 not GPL-compatible?", "According to", " Richard Stallman",
         "According to Richard Stallman"),
        ("In which country was Python created?", "Python was created in the early 1990s in the", " Netherlands",
         "in the Netherlands"),
        ("In which state is Reston, where CNRI was?", "CNRI was in Reston,", " Virginia", "in Reston, Virginia"),
        ("Who made the Python releases possible under Guido's direction?",
         "The releases were made possible by the many outside", " volunteers", "outside volunteers who have worked"),
    ],
    "python-psf-licence": [
        ("Under which license are Python software and documentation licensed?",
         "Python software and documentation are licensed under the",
         " Python Software Foundation License Version 2", "Python Software Foundation License Version 2."),
        ("Starting with which Python version are the examples in the documentation dual licensed?",
         "The examples in the documentation are dual licensed starting with Python", " 3.8.6",
         "Starting with Python 3.8.6"),
        ("Besides the PSF License, under which license are the examples in the documentation?",
         "Besides the PSF License Version 2, the examples are licensed under the", " Zero-Clause BSD license",
         "and the Zero-Clause BSD license"),
        ("What must a Licensee include in a derivative work of Python?",
         "The Licensee must include in the derivative work a brief", " summary",
         "a brief summary of the changes made to Python"),
        ("What makes the PSF License Agreement terminate automatically?",
         "The License Agreement terminates automatically upon a material", " breach",
         "will automatically terminate upon a material breach"),
        ("What of PSF's does the agreement not let the Licensee use in a trademark sense?",
         "The agreement does not grant permission to use PSF", " trademarks",
         "does not grant permission to use PSF trademarks"),
        ("Between whom is the PSF License Agreement?",
         "The agreement is between the Python Software Foundation and the", " Individual or Organization",
         'and the Individual or Organization ("Licensee")'),
        ("What kind of license does PSF grant the Licensee?", "PSF grants Licensee a",
         " nonexclusive, royalty-free, world-wide license", "grants Licensee a nonexclusive, royalty-free"),
        ("How are the examples in the documentation licensed since Python 3.8.6?",
         "Since Python 3.8.6, the examples in the documentation are", " dual", "are dual licensed under the PSF"),
    ],
    "cnri-licence": [
        ("What is the address of CNRI's office?", "CNRI has an office at", " 1895 Preston White Drive",
         "having an office at 1895 Preston White Drive"),
        ("What is the handle of the CNRI License Agreement?", "The handle of the agreement is",
         " 1895.22/1013", "(known as a handle): 1895.22/1013"),
        ("Where U.S. federal law does not apply, which law governs the CNRI agreement?",
         "Where U.S. federal law does not apply, the agreement is governed by the law of the Commonwealth of",
         " Virginia", "by the law of the Commonwealth of Virginia, excluding"),
        ("Which law governs the CNRI License Agreement first?",
         "The agreement is governed by the federal intellectual property law of the", " United States",
         "federal intellectual property law of the United States"),
        ("What is the ZIP code of CNRI's office?", "CNRI's office is in Reston, VA", " 20191",
         "Reston, VA 20191"),
        ("Under which license was the non-separable material previously distributed?",
         "The material was previously distributed under the GNU", " General Public License",
         "previously distributed under the GNU General Public License"),
        ("Which years does CNRI's notice of copyright cover?", "CNRI's notice of copyright covers",
         " 1995-2001", "Copyright (c) 1995-2001 Corporation"),
        ("From what else may the CNRI agreement be obtained on the internet?",
         "The agreement may also be obtained from a", " proxy server", "obtained from a proxy server"),
        ("What is CNRI's persistent identifier for the agreement known as?",
         "The unique, persistent identifier is known as a", " handle", "(known as a handle)"),
        ("On which drive is CNRI's office?", "CNRI's office is at 1895", " Preston", "1895 Preston White Drive"),
        ("Where can Python 1.6.1 and its agreement be located with the identifier?",
         "Python 1.6.1 and the agreement may be located on the", " internet", "may be located on the internet"),
    ],
    "beopen-cwi-licences": [
        ("The law of which state governs the BeOpen License Agreement?",
         "The BeOpen agreement is governed by the law of the State of", " California",
         "by the law of the State of California"),
        ("In which city is BeOpen's office?", "BeOpen has an office in", " Santa Clara",
         "160 Saratoga Avenue, Santa Clara, CA 95051"),
        ("On which street is BeOpen's office?", "BeOpen's office is at 160", " Saratoga Avenue",
         "160 Saratoga Avenue, Santa Clara, CA 95051"),
        ("In which city is Stichting Mathematisch Centrum?", "Stichting Mathematisch Centrum is in",
         " Amsterdam", "Stichting Mathematisch Centrum Amsterdam"),
        ("Up to which Python version does the CWI License Agreement go?",
         "The CWI License Agreement covers Python 0.9.0 through", " 1.2",
         "CWI LICENSE AGREEMENT FOR PYTHON 0.9.0 THROUGH 1.2"),
        ("For which Python version is the BeOpen License Agreement?",
         "The BeOpen License Agreement is for Python", " 2.0", "BEOPEN.COM LICENSE AGREEMENT FOR PYTHON 2.0"),
        ("Which logos may be used under the BeOpen License Agreement?",
         "As an exception, the logos that may be used are the", ' "BeOpen Python" logos',
         'the "BeOpen Python" logos'),
        ("Which years does the CWI copyright cover?", "The CWI copyright covers", " 1991 - 1995",
         "Copyright (c) 1991 - 1995"),
        ("In what may the name of Stichting Mathematisch Centrum not be used without permission?",
         "The name of Stichting Mathematisch Centrum or CWI may not be used in", " advertising",
         "not be used in advertising"),
        ("What else may be used under the BeOpen License Agreement, as an exception?",
         'As an exception, the "BeOpen Python"', " logos", 'the "BeOpen Python" logos'),
    ],
    "sympy-readme": [
        ("Who started SymPy?", "SymPy was started by", " Ondřej Čertík", "SymPy was started by Ondřej Čertík"),
        ("When did Fabian Pedregosa join SymPy?", "Fabian Pedregosa joined the project in", " February 2007",
         "In February\n2007, Fabian Pedregosa joined"),
        ("Who rewrote SymPy's core from scratch?", "SymPy's core was rewritten from scratch by",
         " Pearu Peterson", "Pearu Peterson joined the development"),
        ("Who wrote mpmath?", "mpmath was written by", " Fredrik Johansson", "Fredrik Johansson has\nwritten mpmath"),
        ("Who took Ondřej Čertík's place as lead developer?",
         "The lead developer after Ondřej Čertík is Aaron", " Meurer", "with Aaron\nMeurer"),
        ("Who contributed pretty-printing to SymPy?", "Pretty-printing was contributed by Jurjen N.E.",
         " Bos", "Jurjen N.E. Bos\nhas contributed pretty-printing"),
        ("On which service does SymPy have a community chat?", "SymPy has a community chat at", " Gitter",
         "We have a community chat at [Gitter]"),
        ("From which version control system did SymPy's development move in 2007?",
         "In 2007, development moved from", " svn", "development moved from svn to hg"),
        ("How much faster did rewriting the core make SymPy?", "Rewriting the core made SymPy from",
         " 10x to 100x faster", "from 10x to 100x faster"),
        ("Which license covers the files in the sympy repository?",
         "The files in the sympy repository are covered by the New", " BSD License",
         "License: New BSD License"),
        ("In which year did Ondřej Čertík step down as lead developer?",
         "Ondřej Čertík stepped down as lead developer in", " 2011", "In 2011, Ondřej Čertík stepped down"),
        ("Who took Ondřej Čertík's place as lead developer in 2011?",
         "Ondřej Čertík's place as lead developer was taken by", " Aaron", "with Aaron\nMeurer"),
        ("In which month of 2007 did Fabian Pedregosa join SymPy?",
         "Fabian Pedregosa joined the project in the month of", " February", "In February\n2007, Fabian Pedregosa joined"),
        ("Besides work, what keeps Ondřej Čertík too busy to lead development?",
         "Ondřej Čertík is too busy with work and", " family", "busy\nwith work and family"),
        ("Where can you find answers to your queries about SymPy?", "You can find answers on", " Stack",
         "on Stack Overflow"),
    ],
    "sklearn-datasets": [
        ("Between which dates were the Olivetti face images taken?", "The images were taken between",
         " April 1992 and April 1994", "taken between April 1992 and\nApril 1994"),
        ("To how many grey levels is the Olivetti image quantized?", "The image is quantized to",
         " 256 grey levels", "quantized to 256 grey levels"),
        ("Which census was the California Housing dataset derived from?",
         "The California Housing dataset was derived from the", " 1990 U.S. census",
         "derived from the 1990 U.S. census"),
        ("Where was the California Housing dataset obtained from?", "This dataset was obtained from the",
         " StatLib", "This dataset was obtained from the StatLib"),
        ("What is a household?", "A household is a group of people residing within a", " home",
         "residing within a home"),
        ("In what unit is the median house value expressed?", "The median house value is expressed in",
         " hundreds of thousands of dollars", "expressed in hundreds of thousands of dollars"),
        ("Who made the preprocessing programs for the digits available?",
         "The preprocessing programs were made available by", " NIST",
         "Preprocessing programs made available by NIST"),
        ("How many people contributed to the digits training set?",
         "The number of people who contributed to the training set is", " 30", "30 contributed to the training set"),
        ("What size were the original Olivetti images?", "The original dataset consisted of", " 92 x 112",
         "The original dataset consisted of 92 x 112"),
        ("What is the typical population of a block group?", "A block group typically has a population of",
         " 600 to 3,000 people", "population\nof 600 to 3,000 people"),
        ("Into what blocks are the 32x32 bitmaps of the digits divided?",
         "The 32x32 bitmaps are divided into nonoverlapping blocks of", " 4x4", "nonoverlapping blocks of\n4x4"),
        ("In which month of 1992 were the first Olivetti images taken?", "The Olivetti images were first taken in",
         " April", "taken between April 1992"),
        ("Which U.S. bureau publishes sample data for block groups?",
         "Sample data for block groups is published by the U.S.", " Census",
         "U.S.\nCensus Bureau publishes sample data"),
        ("What kind of background were the Olivetti images taken against?", "All the images were taken against a",
         " dark", "against a dark"),
        ("Which block groups have surprisingly large numbers of rooms per household?",
         "Large values appear for block groups with few households and many empty houses, such as vacation",
         " resorts", "such as vacation resorts"),
        ("The target variable is the median house value for what?",
         "The target variable is the median house value for California", " districts",
         "median house value for California districts"),
        ("In which position were the Olivetti subjects?", "The subjects were in an upright,", " frontal",
         "upright, frontal position"),
    ],
}


#: The second evaluation set (written after the first set's results were known, evaluated once
#: with the library's defaults as they stood): four more documents, the same rule.
SECOND_QUESTIONS = {
    "pytz-readme": [
        ("Who is the author of pytz?", "The author of pytz is", " Stuart Bishop", ":Author: Stuart Bishop"),
        ("Which timezone database does pytz bring into Python?", "pytz brings into Python the", " Olson",
         "pytz brings the Olson tz database into Python"),
        ("From which year does pytz fail for dates?", "The library fails for dates starting", " 2038",
         "This library fails for dates starting 2038"),
        ("Which module should projects using Python 3.9 or later use?",
         "Projects using Python 3.9 or later should use the standard library module", " zoneinfo",
         "should use the standard library"),
        ("Which method corrects times that cross DST boundaries?", "The method provided to correct this is called",
         " normalize", "method is provided to correct this"),
        ("Which method creates local wallclock times?", "To create local wallclock times you need to use the",
         " localize", "you need to use the ``localize()`` method"),
        ("Which PEP would resolve these issues?", "These issues cannot be resolved without modifying the Python "
         "datetime implementation, see PEP-", "431", "(see PEP-431)"),
        ("What is the licence of pytz?", "pytz is released under the", " MIT", "MIT license."),
        ("Under which licence is the code available as part of Zope 3?",
         "As part of Zope 3, the code is available under the", " Zope Public License",
         "available as part of Zope 3 under the Zope Public"),
        ("Where are announcements of new releases made?", "Announcements of new releases are made on",
         " Launchpad", "Announcements of new releases are made on"),
        ("Via whom can security issues be reported?", "Reports about security issues can be made via",
         " Tidelift", "Reports about security issues can be made via"),
        ("To what are offsets from UTC rounded?", "Offsets from UTC are rounded to the nearest whole", " minute",
         "rounded to the nearest whole minute"),
        ("How far out can Europe/Amsterdam pre 1937 be?", "Timezones such as Europe/Amsterdam pre 1937 will be up to",
         " 30 seconds", "will be up to 30 seconds out"),
        ("Whose project provides translations of the timezone names?",
         "The translations are provided by the CLDR project of the", " Unicode Consortium",
         "Unicode Locales (CLDR)"),
        ("Whose l18n package can be used to access the translations?",
         "Besides Babel, the translations can be accessed with the l18n package by", " Thomas Khyn",
         "Thomas Khyn's"),
        ("Which Python version or higher does pytz support?", "pytz allows timezone calculations using Python",
         " 2.4", "using Python 2.4"),
        ("Where should errors in timezone definitions be reported?",
         "Errors in timezone definitions should be reported to the", " time zone mailing list",
         "reported to the time zone mailing"),
    ],
    "tqdm-readme": [
        ("From which language's word does tqdm derive?", "tqdm derives from the", " Arabic",
         "derives from the Arabic word"),
        ("What is the word tqdm derives from?", "tqdm derives from the Arabic word", " taqaddum",
         "derives from the Arabic word"),
        ("What does tqdm abbreviate in Spanish?", 'In Spanish, tqdm is an abbreviation for "', "I love you so much",
         'abbreviation for "I love you so much"'),
        ("What is tqdm's overhead per iteration?", "tqdm's overhead is about", " 60ns", "about 60ns per iteration"),
        ("What is the overhead with tqdm.gui?", "With tqdm.gui, the overhead per iteration is", " 80ns",
         "(80ns with"),
        ("What overhead does ProgressBar have?", "ProgressBar has an overhead per iteration of", " 800ns",
         "has an 800ns/iter overhead"),
        ("Which module does tqdm not even require?", "tqdm does not require any dependencies, not even", " curses",
         "not even ``curses``"),
        ("What is the fallback when unicode is not supported?", "The fallback is an", " ascii",
         "The fallback is an ``ascii``-only bar"),
        ("Who is tqdm's primary maintainer?", "The primary maintainer of tqdm is", " Casper da Costa-Luis",
         "Casper da Costa-Luis"),
        ("Who is tqdm's original author?", "The original author of tqdm is", " Noam Yorav-Raphael",
         "Noam Yorav-Raphael"),
        ("What value of TQDM_MININTERVAL avoids log spam?", "To avoid log spam, export TQDM_MININTERVAL=", "5",
         "TQDM_MININTERVAL=5"),
        ("Which decorator handles the override logic?", "The override logic is handled by the decorator",
         " tqdm.utils.envwrap", "handled by the ``tqdm.utils.envwrap``"),
        ("Who is the maintainer with the GitHub handle lrq3000?", "The maintainer with the GitHub handle lrq3000 is",
         " Stephen Larroque", "Stephen Larroque"),
        ("Who is the maintainer with the GitHub handle kmike?", "The maintainer with the GitHub handle kmike is",
         " Mikhail Korobov", "Mikhail Korobov"),
        ("Which control characters does tqdm need besides line feed?",
         "Besides line feed, tqdm needs an environment supporting", " carriage return",
         "an environment supporting ``carriage return"),
    ],
    "pytorch-readme": [
        ("What does PyTorch use to build neural networks?", "PyTorch builds neural networks by using and replaying a",
         " tape recorder", "using and replaying a tape recorder"),
        ("Which frameworks have a static view of the world?",
         "Frameworks with a static view of the world include TensorFlow, Theano, Caffe, and", " CNTK",
         "TensorFlow, Theano, Caffe, and CNTK"),
        ("What technique does PyTorch use?", "PyTorch uses a technique called", " reverse-mode auto-differentiation",
         "a technique called reverse-mode auto-differentiation"),
        ("Which acceleration library from Intel does PyTorch integrate?",
         "PyTorch integrates acceleration libraries such as Intel", " MKL", "acceleration libraries"),
        ("Which NVIDIA libraries does PyTorch integrate?", "From NVIDIA, PyTorch integrates cuDNN and", " NCCL",
         "acceleration libraries"),
        ("How many minor releases does PyTorch have a year?", "Typically, the number of minor PyTorch releases a year is",
         " three", "three minor releases a year"),
        ("Which packages can you use besides Cython?", "You can use packages such as Cython and", " Numba",
         "and use packages such as"),
        ("Which work inspired PyTorch's autograd?",
         "Inspiration comes from work such as torch-autograd, autograd and", " Chainer", "Our inspiration comes"),
        ("What has been written for the GPU?", "For the GPU, they have written custom", " memory allocators",
         "custom memory allocators for the GPU"),
        ("Compared to what is PyTorch's memory usage extremely efficient?",
         "The memory usage in PyTorch is extremely efficient compared to", " Torch",
         "extremely efficient compared to Torch"),
        ("What might sending a PR without discussion result in?",
         "Sending a PR without discussion might end up resulting in a", " rejected PR",
         "resulting in a rejected PR"),
        ("Is PyTorch a Python binding into what?", "PyTorch is not a Python binding into a monolithic",
         " C++ framework", "not a Python binding into a monolithic"),
    ],
    "sklearn-datasets-second": [
        ("Who created the 1998 DARPA Intrusion Detection System Evaluation dataset?",
         "The 1998 DARPA Intrusion Detection System Evaluation dataset was created by", " MIT Lincoln Lab",
         "created by MIT Lincoln Lab"),
        ("What proportion of the KDD data is abnormal?", "The proportion of abnormal data is", " 80.1%",
         "large proportion (80.1%)"),
        ("What anomaly proportion does SA have?", "SA gives an anomaly proportion of", " 1%",
         "anomaly proportion of 1%"),
        ("What proportion of attack does SF have?", "SF gives a proportion of attack of", " 0.3%",
         "which gives a proportion of 0.3%"),
        ("How large are the forest patches?", "The samples correspond to patches of forest of", " 30×30m",
         "correspond to 30×30m patches"),
        ("How many covertypes are there?", "The number of covertypes is", " seven", "There are seven covertypes"),
        ("How many features does each covertype sample have?", "Each sample has", " 54 features",
         "Each sample has 54 features"),
        ("What is the common name of Bradypus variegatus?", "Bradypus variegatus is the", " Brown-throated Sloth",
         "the Brown-throated Sloth"),
        ("What is Microryzomys minutus also known as?", "Microryzomys minutus is also known as the",
         " Forest Small Rice Rat", "Forest Small Rice Rat"),
        ("Who provides the species distribution dataset?", "The dataset is provided by", " Phillips",
         "provided by Phillips et. al."),
        ("Where are the two species distributed?",
         "The dataset represents the geographic distribution of two species in Central and", " South America",
         "two species in Central and"),
        ("How many samples does the general KDD structure have?", "The general KDD structure has a total of",
         " 4898431", "Samples total 4898431"),
        ("Which feature of SF do the http and smtp subsets correspond to?",
         "http and smtp are two subsets of SF corresponding with the", " third feature",
         "corresponding with third feature"),
    ],
}


def documents() -> list[dict]:
    """The six documents: ``id``, ``title``, ``source``, ``licence``, ``text``."""
    licence = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "LICENSE.txt")
    if not licence.is_file():  # a Python whose standard library sits elsewhere (Debian's)
        licence = Path(importlib.util.find_spec("os").origin).parent / "LICENSE.txt"
    text = licence.read_text(encoding="utf-8")
    beopen, cnri = text.index("BEOPEN.COM LICENSE AGREEMENT"), text.index("CNRI LICENSE AGREEMENT")
    cwi, zero = text.index("CWI LICENSE AGREEMENT"), text.index("ZERO-CLAUSE BSD LICENSE")
    terms = text.index("B. TERMS AND CONDITIONS")
    python = f"CPython {sys.version.split()[0]}, LICENSE.txt"
    psf = "PSF License Agreement for Python (the file is Python's licence text)"
    sympy = _sympy_readme()
    sklearn = _sklearn_descriptions(("olivetti_faces", "california_housing", "digits"))
    return [
        dict(id="python-history", title="A. History of the software", source=f"{python}, section A",
             licence=psf, text=text[:terms].strip()),
        dict(id="python-psf-licence", title="B. Terms and conditions: the PSF License",
             source=f"{python}, section B up to the BeOpen licence", licence=psf, text=text[terms:beopen].strip()),
        dict(id="cnri-licence", title="CNRI License Agreement for Python 1.6.1",
             source=f"{python}, the CNRI licence", licence=psf, text=text[cnri:cwi].strip()),
        dict(id="beopen-cwi-licences", title="BeOpen and CWI licence agreements",
             source=f"{python}, the BeOpen and CWI licences", licence=psf,
             text=text[beopen:cnri].strip() + "\n\n\n" + text[cwi:zero].strip()),
        dict(id="sympy-readme", title="SymPy README: authors, installation, bugs, brief history",
             source=f"SymPy {importlib.metadata.version('sympy')}, README (package metadata)",
             licence="BSD-3-Clause (New BSD License, SymPy)", text=sympy),
        dict(id="sklearn-datasets", title="scikit-learn data-set descriptions: Olivetti faces, California "
             "housing, digits", source=f"scikit-learn {importlib.metadata.version('scikit-learn')}, "
             "sklearn/datasets/descr/{olivetti_faces,california_housing,digits}.rst (reference lists cut)",
             licence="BSD-3-Clause (scikit-learn)", text=sklearn),
    ]


def second_documents() -> list[dict]:
    """The second set's four documents: the READMEs of pytz, tqdm and PyTorch (their package
    metadata; prose sections, cut verbatim) and three more of scikit-learn's data-set
    descriptions."""
    pytz, tqdm, torch = (_metadata_readme(name) for name in ("pytz", "tqdm", "torch"))
    versions = {name: importlib.metadata.version(name) for name in ("pytz", "tqdm", "torch", "scikit-learn")}
    sklearn = ("kddcup99", "covtype", "species_distributions")
    return [
        dict(id="pytz-readme", title="pytz README: introduction, installation, licence, limitations, contact",
             source=f"pytz {versions['pytz']}, README (package metadata), without installation, the enterprise "
             "offer and the examples", licence="MIT (pytz)",
             text=_cut(pytz, "pytz - World Timezone", "Installation\n~~~")
             + "\n\n" + _cut(pytz, "Internationalization - i18n/l10n", None)),
        dict(id="tqdm-readme", title="tqdm README: introduction, known issues, contributions",
             source=f"tqdm {versions['tqdm']}, README (package metadata): its introduction, two items of its FAQ "
             "and its contributions",
             licence="MPL-2.0 and MIT (tqdm)",
             text="\n\n".join([_cut(tqdm, "``tqdm`` derives", "**Featured Sponsors**"),
                               _cut(tqdm, "- Unicode:", "- Wrapping generators:"),
                               _cut(tqdm, "- Overriding defaults", "If you come across"),
                               _cut(tqdm, "All source code is hosted", "Ports to Other Languages")])),
        dict(id="pytorch-readme", title="PyTorch README: more about PyTorch, releases and contributing",
             source=f"PyTorch {versions['torch']}, README (package metadata)", licence="BSD-3-Clause (PyTorch)",
             text=_cut(torch, "### A GPU-Ready Tensor Library", "## Installation") + "\n\n"
             + _cut(torch, "## Releases and Contributing", "## The Team")),
        dict(id="sklearn-datasets-second", title="scikit-learn data-set descriptions: KDD Cup '99, forest "
             "covertypes, species distributions", source=f"scikit-learn {versions['scikit-learn']}, "
             "sklearn/datasets/descr/{" + ",".join(sklearn) + "}.rst (reference lists and the KDD subsets' "
             "tables cut)",
             licence="BSD-3-Clause (scikit-learn)", text=_without(_sklearn_descriptions(sklearn), "SA structure:",
                                                                  ":func:`sklearn.datasets.fetch_kddcup99`")),
    ]


def _without(text: str, start: str, end: str) -> str:
    """``text`` without the part from ``start`` up to ``end``."""
    return text[:text.index(start)] + text[text.index(end):]


def _metadata_readme(name: str) -> str:
    return importlib.metadata.distribution(name).read_text("METADATA").split("\n\n", 1)[1]


def _cut(text: str, start: str, end: str | None) -> str:
    """``text`` from ``start`` up to ``end`` (the end of the text where ``None``), stripped."""
    begin = text.index(start)
    return text[begin:text.index(end, begin) if end else len(text)].strip()


def _sympy_readme() -> str:
    readme = _metadata_readme("sympy")
    sections = {}
    for part in readme.split("\n## "):
        title, _, body = part.partition("\n")
        sections[title.strip()] = body
    head = readme[readme.index("See the [AUTHORS]"):readme.index("## Download")].strip()
    return "\n\n".join([head] + [f"## {name}\n{sections[name].rstrip()}"
                                 for name in ("Installation", "Bugs", "Brief History")])


def _sklearn_descriptions(names: tuple[str, ...]) -> str:
    folder = Path(importlib.util.find_spec("sklearn").origin).parent / "datasets" / "descr"
    parts = []
    for name in names:
        text = (folder / f"{name}.rst").read_text(encoding="utf-8")
        parts.append(text.split(".. dropdown:: References")[0].split(".. rubric:: References")[0].strip())
    return "\n\n".join(parts)


def _normal(text: str) -> str:
    return " ".join(text.split())


def questions(docs: list[dict], tokenizer, written: dict | None = None) -> list[dict]:
    """Each question with its document, its evidence paragraph and its answer's tokens; a
    question whose evidence is not in exactly one paragraph, or whose answer is not in that
    paragraph, stops the build."""
    from captum_ffb.long_context.attribution import split_context

    rows = []
    for doc in docs:
        paragraphs = [doc["text"][s:e] for s, e in split_context(doc["text"], "paragraph")]
        for k, (question, lead, answer, evidence) in enumerate((written or QUESTIONS)[doc["id"]]):
            found = [p for p, text in enumerate(paragraphs) if _normal(evidence) in _normal(text)]
            if len(found) != 1 or _normal(answer) not in _normal(paragraphs[found[0]]):
                raise ValueError(f"{doc['id']} question {k}: evidence in paragraphs {found}")
            ids = tokenizer(answer, add_special_tokens=False).input_ids
            rows.append(dict(id=f"{doc['id']}/{k}", doc=doc["id"], question=question, lead=lead, answer=answer,
                             evidence=evidence, paragraph=found[0], answer_tokens=len(ids),
                             kind="one-token" if len(ids) == 1 else "several-token"))
    return rows


def answered(model, tokenizer, docs: list[dict], rows: list[dict]) -> None:
    """Each question's log-probability with the whole document and with an empty context, the
    greedy first token, and whether it is kept (``kept``, ``reason``)."""
    import torch
    from metrics import chat_template

    template = chat_template(tokenizer)
    texts = {d["id"]: d["text"] for d in docs}
    for row in rows:
        answer = tokenizer(row["answer"], add_special_tokens=False).input_ids
        values = {}
        for name, context in (("with", texts[row["doc"]]), ("without", "")):
            prompt = template.replace("{context}", context).replace("{question}", row["question"]) + row["lead"]
            ids = tokenizer(prompt).input_ids
            with torch.no_grad():
                logits = model(torch.tensor([ids + answer[:-1]]), logits_to_keep=len(answer)).logits[0].double()
            values[name] = float(torch.log_softmax(logits, -1)[torch.arange(len(answer)), torch.tensor(answer)].sum())
            if name == "with":
                row["prompt_tokens"] = len(ids)
                row["greedy"] = tokenizer.decode([int(logits[0].argmax())])
        row["logp_context"], row["logp_empty"] = values["with"], values["without"]
        gain_ok = values["with"] - values["without"] >= GAIN
        greedy_ok = row["greedy"] == tokenizer.decode(answer[:1])
        row["kept"] = gain_ok and greedy_ok
        row["reason"] = "kept" if row["kept"] else "; ".join(
            ([] if gain_ok else [f"the document raises log p by {values['with'] - values['without']:.2f} < log 10"])
            + ([] if greedy_ok else [f"greedy first token {row['greedy']!r}, not {tokenizer.decode(answer[:1])!r}"]))
        print(f"{row['id']:24s} {row['kind']:13s} {values['with']:8.2f} {values['without']:8.2f} {row['reason']}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--second", action="store_true",
                        help="the second evaluation set (questions-second.json unless --out)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or HERE / ("questions-second.json" if args.second else "questions.json")
    sys.path.insert(0, str(HERE))
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.io.files import write_json
    from captum_ffb.long_context.attribution import split_context

    loaded = load_model(smollm2_dir(required=True), show_progress=False)
    docs = second_documents() if args.second else documents()
    for doc in docs:
        doc["tokens"] = len(loaded.tokenizer(doc["text"]).input_ids)
        doc["sentences"] = len(split_context(doc["text"], "sentence"))
        doc["paragraphs"] = len(split_context(doc["text"], "paragraph"))
    rows = questions(docs, loaded.tokenizer, SECOND_QUESTIONS if args.second else QUESTIONS)
    answered(loaded.model, loaded.tokenizer, docs, rows)
    kept = [r for r in rows if r["kept"]]
    summary = {kind: dict(written=sum(r["kind"] == kind for r in rows), kept=sum(r["kind"] == kind for r in kept))
               for kind in ("one-token", "several-token")}
    write_json(out, dict(model="SmolLM2-135M-Instruct", rule="kept: log p(answer | document) − log p(answer | "
                              "empty context) ≥ log 10 and the answer's first token greedy", summary=summary,
                              documents=docs, questions=rows))
    print(summary)


if __name__ == "__main__":
    main()

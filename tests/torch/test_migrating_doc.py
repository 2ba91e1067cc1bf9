"""docs/migrating.rst stays true: every ``te.`` name it says te has exists, every TE argument a te
module rejects as not implemented is listed there, and every TE name it says te lacks is absent
(add it to the doc's table when it lands)."""

import pathlib
import re

import te_torch as te
from te_torch._module_base import UNSUPPORTED_KWARGS

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "migrating.rst").read_text()
TE_PART = DOC.split("From torchao float8")[0]


def test_names_the_doc_gives_te_exist():
    table = TE_PART.split("Checkpoints.")[0]
    names = set(re.findall(r"``te\.([A-Za-z_][\w.]*)", table))
    assert len(names) >= 15, names
    for name in names:
        obj = te
        for part in name.removesuffix("()").split("."):
            assert hasattr(obj, part), name
            obj = getattr(obj, part)


def test_every_rejected_module_argument_is_listed():
    listed = TE_PART.split("Not implemented yet, by argument")[1]
    for kw in UNSUPPORTED_KWARGS:
        assert f"``{kw}``" in listed, kw


def test_names_the_doc_says_te_lacks_are_absent():
    lacking = TE_PART.split("Not in te yet at all:")[1].split("From torchao")[0]
    names = re.findall(r"``(?:te\.)?([A-Za-z_]\w*)``", lacking)
    assert "initialize_ub" in names
    for name in names:
        assert not hasattr(te, name), f"te.{name} exists now: move it into docs/migrating.rst's table"

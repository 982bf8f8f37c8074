"""Nothing generated changes unless it is meant to: sampled configs of every formulation of every
operation (tests/data/render_digests.json, written by scripts/render_digests.py) render to the
CUDA source and plan digest they had when the file was written.

A failure names each case that differs: a plan digest that moved is a change of the code or of how
it launches; a source that differs in its header lines only is a change of the config text or of a
fingerprint (a template or the Python hashed into it was edited without changing the code, which
makes shipped records current by plan digest only: run scripts/stamp_plan_digests.py). Where the
change is meant, run scripts/render_digests.py and commit the file with it."""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import render_digests  # noqa: E402


def _document() -> dict:
    return json.loads(render_digests.DIGESTS.read_text())


def test_sampled_configs_of_every_formulation_render_as_recorded():
    document = _document()
    diffs = render_digests.differences(document)
    assert not diffs, f"{len(diffs)} of {len(document['cases'])} cases differ:\n" + "\n".join(diffs[:20])


def test_the_sample_covers_every_formulation_of_every_operation_and_precision():
    document = _document()
    per_group = collections.Counter(case["group"] for case in document["cases"])
    assert set(per_group) == render_digests.groups_registered()
    assert min(per_group.values()) >= 4, per_group.most_common()[-1]
    # Shapes that divide nothing evenly are in every group of a convolution.
    odd = {case["group"] for case in document["cases"] if "/odd" in case["problem"] or "/sep_odd" in case["problem"]}
    conv_groups = {g for g in per_group if g.split("/")[0].startswith(("conv", "sep_conv"))
                   and not g.startswith("conv_pool")}
    assert conv_groups <= odd, sorted(conv_groups - odd)
